"""Creating contexts: validate the spec, resolve seeds and calibrate the mechanism once.

The calibrated values (sigma, sensitivity, the exact epsilon of one answer) are stored with
the context so every answer and every report quotes the same numbers. Each mechanism
calibrates itself and declares its cost event (:mod:`dpicl.mechanisms.registry`).
"""

from __future__ import annotations

from dpicl.domain import ContextLimits
from dpicl.mechanisms.base import Record
from dpicl.mechanisms.registry import get_mechanism, mechanism_of
from dpicl.privacy.accounting import budget_mu2
from dpicl.privacy.ledger import Cost
from dpicl.spec import ContextSpec
from dpicl.store.models import ContextRow
from dpicl.store.repository import ContextRepository, StoredContext, new_context_id


def calibrate_mechanism(spec: ContextSpec) -> Record:
    """The stored mechanism record: the user's settings plus what calibration derived."""
    mech = get_mechanism(spec.mechanism.name)
    return mech.record(mech.calibrate(spec.mechanism, len(spec.exemplars)))


async def create_context(
    spec: ContextSpec, repo: ContextRepository, limits: ContextLimits | None = None
) -> StoredContext:
    spec.check(limits)
    mech = get_mechanism(spec.mechanism.name)
    calibration = mech.calibrate(spec.mechanism, len(spec.exemplars))
    budget = spec.budget.model_dump() if spec.budget is not None else None
    max_queries: int | None = None
    own = mech.own_budget(calibration)
    if own is not None:
        # The mechanism's own (epsilon, delta) is the context's budget, spent in queries.
        budget = {"epsilon": own.epsilon, "delta": own.delta}
        max_queries = own.max_queries
    mu2_max = budget_mu2(spec.budget.epsilon, spec.budget.delta) if spec.budget else None
    row = ContextRow(
        id=new_context_id(),
        name=spec.name,
        task=spec.task,
        labels=list(spec.labels),
        exemplars=[e.model_dump() for e in spec.exemplars],
        template=spec.resolved_template(),
        mechanism=mech.record(calibration),
        budget=budget,
        mu2_spent=0.0,
        mu2_max=mu2_max,
        queries=0,
        max_queries=max_queries,
        tenant=spec.tenant,
    )
    return await repo.add(row)


def cost_of(context: StoredContext) -> Cost:
    """The cost event of one answer of ``context``'s mechanism."""
    return mechanism_of(context).cost_of(context)
