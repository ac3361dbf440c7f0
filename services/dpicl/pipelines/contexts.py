"""Creating contexts: validate the spec, resolve seeds and calibrate the mechanism once.

The calibrated values (sigma, sensitivity, the exact epsilon of one answer) are stored with
the context so every answer and every report quotes the same numbers.
"""

from __future__ import annotations

import secrets
from typing import Any

from dpicl.domain import ContextLimits, ContextSpec, MozoSettings
from dpicl.engines.base import Exemplar
from dpicl.mechanisms.esa import esa_sensitivity
from dpicl.privacy.accounting import budget_mu2, gaussian_mu2
from dpicl.privacy.calibration import VOTING_SENSITIVITY, epsilon_exact, sigma_for
from dpicl.privacy.ledger import Cost, guarantee_of, mozo_spent_epsilon
from dpicl.privacy.mozo_calibration import calibrate_beta
from dpicl.privacy.mozo_proven import calibrate_max_log_ratio
from dpicl.store.models import ContextRow
from dpicl.store.repository import ContextRepository, StoredContext, new_context_id


def calibrate_mechanism(spec: ContextSpec) -> dict[str, Any]:
    """The stored mechanism record: the user's settings plus what calibration derived."""
    mech = spec.mechanism
    if isinstance(mech, MozoSettings):
        return calibrate_mozo(mech, len(spec.exemplars))
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


def calibrate_mozo(mech: MozoSettings, n_exemplars: int) -> dict[str, Any]:
    """For ``queries * max_tokens`` tokens at q = n_shots/|D|: eps0 in the proven mode
    (:mod:`dpicl.privacy.mozo_proven`), beta in the paper's (paper 004, Eq. 8)."""
    delta = mech.resolved_delta(n_exemplars)
    if mech.guarantee == "proven":
        proven = calibrate_max_log_ratio(
            mech.epsilon,
            delta,
            n_shots=mech.n_shots,
            sample_rate=mech.n_shots / n_exemplars,
            tokens=mech.queries * mech.max_tokens,
        )
        return mech.model_dump() | {
            "delta": delta,
            "max_log_ratio": proven.max_log_ratio,
            "per_token_epsilon": proven.per_token_epsilon,
            "amplified_per_token_epsilon": proven.amplified_epsilon,
            "sample_rate": proven.sample_rate,
            "tokens": proven.tokens,
        }
    cal = calibrate_beta(
        mech.epsilon,
        delta,
        mech.alpha,
        tokens=mech.queries * mech.max_tokens,
        sample_rate=mech.n_shots / n_exemplars,
    )
    return mech.model_dump() | {
        "delta": delta,
        "max_log_ratio": None,
        "per_token_epsilon": None,
        "alpha": cal.alpha,
        "beta": cal.beta,
        "radius": cal.radius,
        "rdp_epsilon": cal.rdp_epsilon,
        "per_token_rdp": cal.per_token_rdp,
        "sample_rate": cal.sample_rate,
        "tokens": cal.tokens,
    }


async def create_context(
    spec: ContextSpec, repo: ContextRepository, limits: ContextLimits | None = None
) -> StoredContext:
    spec.check(limits)
    mechanism = calibrate_mechanism(spec)
    budget = spec.budget.model_dump() if spec.budget is not None else None
    max_queries: int | None = None
    if isinstance(spec.mechanism, MozoSettings):
        # The mechanism's own (epsilon, delta) is the context's budget, spent in queries.
        budget = {"epsilon": float(mechanism["epsilon"]), "delta": float(mechanism["delta"])}
        max_queries = spec.mechanism.queries
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
        max_queries=max_queries,
        tenant=spec.tenant,
    )
    return await repo.add(row)


def cost_of(context: StoredContext) -> Cost:
    """The cost of one answer of ``context``'s mechanism."""
    m = context.mechanism
    if m["name"] == "public":
        return Cost(epsilon=0.0, delta=0.0, epsilon_exact=0.0, mu2=0.0)
    if m["name"] == "dps-mozo":
        # Budgeted in queries (max_queries), not mu^2. One answer alone is worth T_max tokens.
        # The proven mode's epsilon is the exact optimal composition of its per-token bound;
        # the paper's is nominal, with no exact value.
        one = mozo_spent_epsilon(m, 1)
        return Cost(
            epsilon=one,
            delta=float(m["delta"]),
            epsilon_exact=one if guarantee_of(m) == "proven" else None,
            mu2=0.0,
            epsilon_total=float(m["epsilon"]),
        )
    return Cost(
        epsilon=float(m["epsilon"]),
        delta=float(m["delta"]),
        epsilon_exact=m.get("epsilon_exact"),
        mu2=gaussian_mu2(float(m["sigma"]), float(m["sensitivity"])),
    )


def exemplars_of(context: StoredContext) -> list[Exemplar]:
    return [Exemplar(input=i, output=o) for i, o in context.exemplars]
