"""The audit plan's budgets: how many answers each of its contexts is budgeted for, and how
many one context can hold within the largest budget the server takes
(:mod:`dpicl_audit.estimators.composition` has the composition).

**The server's limit.** A server takes budgets up to its ``DPICL_MAX_BUDGET_EPSILON`` (at most
1000), which it publishes in its ``/healthz`` (``limits.max_budget_epsilon``). A run reads it
when it starts and stores it resolved in its plan (``target.max_budget_epsilon``, as ``design
= "auto"`` is stored resolved), so a resumed run plans the same contexts whatever the server
says then; :func:`budget_limit` reads it back, 1000 for a plan without one (a run of an older
auditor, or a server that publishes none).

**The mechanism's composition.** How many answers one budget holds is the mechanism's own
(``held``: answers at an epsilon within the limit, as its budgets compose them); the default
is the Gaussian claim's mu-GDP composition (:func:`~dpicl_audit.estimators.composition.
answers_in_budget`). A mechanism that composes otherwise (the Laplace voting of
``examples/laplace_voting``, pure DP) passes its own, and its trials are spread over slots by
the same rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.estimators.composition import (
    MAX_BUDGET_EPSILON,
    answers_for_trials,
    answers_in_budget,
    trials_held,
)
from dpicl_audit.jsontypes import JsonMapping
from dpicl_audit.plan.model import AuditPlan
from dpicl_audit.plan.schedule import trial_worlds

__all__ = [
    "Held",
    "budget_limit",
    "clean_rows",
    "context_capacity",
    "gaussian_held",
    "planned_answers",
    "published_budget_limit",
]


def budget_limit(plan: AuditPlan) -> float:
    """The largest budget epsilon the plan's contexts may have: the server's, as the run read
    it (``target.max_budget_epsilon``), else :data:`~dpicl_audit.estimators.composition.
    MAX_BUDGET_EPSILON`."""
    limit = plan.target.max_budget_epsilon
    return MAX_BUDGET_EPSILON if limit is None else min(float(limit), MAX_BUDGET_EPSILON)


def published_budget_limit(health: JsonMapping | None) -> float | None:
    """``limits.max_budget_epsilon`` of a server's ``/healthz``; None where it publishes none
    (a server older than the field, or no health at all). A value that is not a number above
    0 is :class:`TargetProtocolError`, naming it."""
    limits = (health or {}).get("limits")
    if not isinstance(limits, Mapping) or limits.get("max_budget_epsilon") is None:
        return None
    value = limits["max_budget_epsilon"]
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise TargetProtocolError(
            f"the server's /healthz publishes limits.max_budget_epsilon = {value!r}; "
            "expected a number above 0"
        )
    return float(value)


def clean_rows(plan: AuditPlan, k: int) -> int:
    """Clean rows of one world a bootstrap collects in the contexts of the plan's ``k``-th
    epsilon: pair ``j`` goes to epsilon ``j mod K`` (:mod:`dpicl_audit.pipeline.runner`)."""
    return len(range(k, plan.bootstrap.n_llm, len(plan.mechanism.epsilons)))


def _most_per_world(plan: AuditPlan, k: int) -> int:
    """What one world's contexts at the ``k``-th epsilon are asked at most: its trials in a
    run, its clean rows in a bootstrap (the plan serves either)."""
    w = trial_worlds(plan.seed, k, plan.trials)
    return max(int((w == 1).sum()), int((w == 0).sum()), clean_rows(plan, k))


#: The answers one budget within the plan's limit holds at an epsilon, as a mechanism's
#: answers compose (module docstring).
Held = Callable[[float], int]


def gaussian_held(plan: AuditPlan) -> Held:
    """Answers at an epsilon one budget within :func:`budget_limit` holds, composed as the
    mu-GDP answers of a Gaussian claim at the plan's delta."""
    delta, limit = plan.mechanism.delta, budget_limit(plan)
    return lambda epsilon: answers_in_budget(epsilon, delta, limit)


def planned_answers(
    plan: AuditPlan, epsilon: float, world: int, cap: int | None, held: Held | None = None
) -> int:
    """The answers one context of ``world`` at ``epsilon`` is budgeted for: its trials (or
    its bootstrap collection), capped by ``cap`` (the mechanism's queries per context, e.g.
    :func:`context_capacity`), with a retry margin (:func:`~dpicl_audit.estimators.
    composition.answers_for_trials`: less of it where one budget, ``held`` answers at
    ``epsilon`` (default :func:`gaussian_held`), holds no more)."""

    eps = [float(e) for e in plan.mechanism.epsilons]
    k = eps.index(float(epsilon)) if float(epsilon) in eps else 0
    n = max(int((trial_worlds(plan.seed, k, plan.trials) == world).sum()), 1)
    need = max(n, clean_rows(plan, k))
    m = need if cap is None else min(need, cap)
    return answers_for_trials(m, (held or gaussian_held(plan))(epsilon))


def context_capacity(plan: AuditPlan, held: Held | None = None) -> int | None:
    """The trials (or clean rows) one context may be budgeted for within the largest budget
    the server takes (:func:`budget_limit`; composition.trials_held of what one budget holds,
    ``held``, default :func:`gaussian_held`) at the plan's most demanding epsilon, where
    some world's trials or a bootstrap's clean rows need more (None: one context per world
    holds them all)."""

    count = held or gaussian_held(plan)
    # The Gaussian composition holds fewest answers at the largest epsilon; a mechanism's
    # own need not, so every epsilon is asked.
    cap = trials_held(min(count(float(e)) for e in plan.mechanism.epsilons))
    most = max(_most_per_world(plan, k) for k in range(len(plan.mechanism.epsilons)))
    return None if most <= cap else cap
