"""Creating contexts: validate the spec, resolve seeds and calibrate the mechanism once.

The calibrated values (sigma, sensitivity, the exact epsilon of one answer) are stored with
the context so every answer and every report quotes the same numbers.
"""

from __future__ import annotations

import secrets
from typing import Any

from dpicl.domain import ContextSpec
from dpicl.engines.base import Exemplar
from dpicl.mechanisms.esa import esa_sensitivity
from dpicl.privacy.accounting import budget_mu2, gaussian_mu2
from dpicl.privacy.calibration import VOTING_SENSITIVITY, epsilon_exact, sigma_for
from dpicl.privacy.ledger import Cost
from dpicl.store.models import ContextRow
from dpicl.store.repository import ContextRepository, StoredContext, new_context_id


def calibrate_mechanism(spec: ContextSpec) -> dict[str, Any]:
    """The stored mechanism record: the user's settings plus what calibration derived."""
    mech = spec.mechanism
    seed = mech.partition_seed if mech.partition_seed is not None else secrets.randbits(63)
    record: dict[str, Any] = mech.model_dump() | {"partition_seed": seed}
    if mech.name == "esa":
        sensitivity = esa_sensitivity(mech.partitions, mech.sensitivity)
    else:
        sensitivity = VOTING_SENSITIVITY
    sigma = sigma_for(mech.epsilon, mech.delta, sensitivity, mech.calibration)
    record |= {
        "sigma": sigma,
        "sensitivity": sensitivity,
        "epsilon_exact": epsilon_exact(sigma, sensitivity, mech.delta),
    }
    return record


async def create_context(spec: ContextSpec, repo: ContextRepository) -> StoredContext:
    spec.check()
    mechanism = calibrate_mechanism(spec)
    budget = spec.budget.model_dump() if spec.budget is not None else None
    mu2_max = budget_mu2(spec.budget.epsilon, spec.budget.delta) if spec.budget else None
    row = ContextRow(
        id=new_context_id(),
        name=spec.name,
        task=spec.task,
        labels=list(spec.labels),
        exemplars=[e.model_dump() for e in spec.exemplars],
        template=spec.resolved_template(),
        mechanism=mechanism,
        budget=budget,
        mu2_spent=0.0,
        mu2_max=mu2_max,
        queries=0,
        max_queries=None,
    )
    return await repo.add(row)


def cost_of(context: StoredContext) -> Cost:
    """The cost of one answer of ``context``'s mechanism."""
    m = context.mechanism
    return Cost(
        epsilon=float(m["epsilon"]),
        delta=float(m["delta"]),
        epsilon_exact=m.get("epsilon_exact"),
        mu2=gaussian_mu2(float(m["sigma"]), float(m["sensitivity"])),
    )


def exemplars_of(context: StoredContext) -> list[Exemplar]:
    return [Exemplar(input=i, output=o) for i, o in context.exemplars]
