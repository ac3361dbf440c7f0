"""The budget a context of a Gaussian claim holds: how many answers of an (epsilon, delta)
claim one budget holds, composed as the claim allows.

A production server refuses unbudgeted contexts (``DPICL_ALLOW_UNBUDGETED`` is off by
default), so the auditor gives each of its Gaussian contexts (voting, ESA) a budget sized to
the queries it plans to send there. The composition is re-derived here, not read from the
server: a Gaussian mechanism whose exact curve meets its claim (epsilon, delta) is mu-GDP with
``mu <= mu_claim = gdp_mu(epsilon, delta)``; ``q`` answers compose to ``sqrt(q) mu``-GDP
(Dong, Roth and Su 2019, Cor. 3.3), so the budget ``(gdp_epsilon(sqrt(q) mu_claim, delta),
delta)`` holds ``q`` answers whatever calibration the server uses (:func:`budget_for`). The
planned ``q`` has a margin for retried queries.

How many trials one context is planned for (:func:`trials_held`) and how many answers it is
budgeted for (:func:`answers_for_trials`) depend only on how many answers one budget holds;
for a mechanism that composes its answers otherwise (a pure-DP mechanism from outside), that
number is found by :func:`most_that_fit` over its own budgets.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpicl_audit.estimators.gdp import gdp_epsilon, gdp_mu

__all__ = [
    "MAX_BUDGET_EPSILON",
    "RETRY_MARGIN",
    "answers_for_trials",
    "answers_in_budget",
    "answers_within_budget",
    "budget_for",
    "budgeted_answers",
    "composed_epsilon",
    "most_that_fit",
    "planned_queries",
    "trials_held",
]

#: The largest budget epsilon any dpicl server takes (DPICL_MAX_BUDGET_EPSILON is at most
#: this): the limit of a server that does not publish its own (``limits.max_budget_epsilon``
#: of its /healthz; an older server). A context that needs more than the limit even for one
#: trial is sent unbudgeted (``"budget": null``), which only a server with
#: DPICL_ALLOW_UNBUDGETED accepts; the run refuses to start against one that publishes it
#: does not.
MAX_BUDGET_EPSILON = 1000.0
#: Planned queries are multiplied by this and given a few more: retries after lost answers.
RETRY_MARGIN = 1.05
_RETRY_EXTRA = 8
#: :func:`most_that_fit` stops counting here: a budget that holds this many answers holds
#: more than any plan asks of one context.
_MOST_COUNTED = 2**40


def composed_epsilon(mu: float, answers: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``answers`` mu-GDP answers composed."""

    if answers <= 0:
        return 0.0
    return gdp_epsilon(math.sqrt(answers) * mu, delta)


def planned_queries(trials_in_world: int) -> int:
    """The answers a context is budgeted for: its planned queries, with the retry margin."""
    return math.ceil(max(1, trials_in_world) * RETRY_MARGIN) + _RETRY_EXTRA


def budget_for(
    epsilon: float, delta: float, answers: int, limit: float = MAX_BUDGET_EPSILON
) -> dict[str, float] | None:
    """The ``budget`` of a context whose mechanism claims (epsilon, delta) per answer and
    that must hold ``answers`` answers (module docstring); None (unbudgeted) when that is
    above ``limit``, the largest budget epsilon the server takes (its published
    ``limits.max_budget_epsilon``, :data:`MAX_BUDGET_EPSILON` for one that publishes none)."""

    mu_claim = gdp_mu(float(epsilon), float(delta))
    total = composed_epsilon(mu_claim, answers, float(delta))
    # A hair above the composition: the server's own rounding must not refuse the last one.
    b = float(total * (1.0 + 1e-6) + 1e-9)
    return (
        None if b > min(float(limit), MAX_BUDGET_EPSILON) else {"epsilon": b, "delta": float(delta)}
    )


def answers_in_budget(epsilon: float, delta: float, limit: float = MAX_BUDGET_EPSILON) -> int:
    """The most answers at (epsilon, delta) one budget within ``limit`` holds (0: not even
    one): exactly those :func:`budget_for` gives a budget for."""

    mu_claim = gdp_mu(float(epsilon), float(delta))
    mu_max = gdp_mu(min(float(limit), MAX_BUDGET_EPSILON) * (1.0 - 1e-6), float(delta))
    fit = math.floor((mu_max / mu_claim) ** 2)
    # The closed form and budget_for's margin may disagree by one at the boundary.
    while fit > 0 and budget_for(epsilon, delta, fit, limit) is None:
        fit -= 1
    while budget_for(epsilon, delta, fit + 1, limit) is not None:
        fit += 1
    return fit


def most_that_fit(fits: Callable[[int], bool]) -> int:
    """The largest ``n >= 0`` with ``fits(n)`` (0: not even one), for ``fits`` true up to
    some ``n`` and false beyond (a budget that holds ``n`` answers holds fewer), counted up
    to :data:`_MOST_COUNTED`. Doubling, then bisection: about 2 log2(n) calls."""

    if not fits(1):
        return 0
    low, high = 1, 2  # fits(low); high is tried next
    while high <= _MOST_COUNTED and fits(high):
        low, high = high, 2 * high
    if high > _MOST_COUNTED:
        return _MOST_COUNTED
    while high - low > 1:  # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def trials_held(fit: int) -> int:
    """The most trials one context can be planned for (retry margin included) where one
    budget holds ``fit`` answers.

    Where that is fewer answers than one trial's margin (a server whose limit is low for
    this epsilon), half of what it holds (at least 1): such a context is budgeted for all it
    holds (:func:`answers_for_trials`), the other half for retries."""

    n = max(1, math.floor((fit - _RETRY_EXTRA) / RETRY_MARGIN) - 1)
    while n > 1 and planned_queries(n) > fit:
        n -= 1
    if planned_queries(n) > fit:
        return max(1, fit // 2)
    return n


def answers_for_trials(trials: int, fit: int) -> int:
    """The answers a context planned for ``trials`` trials is budgeted for, where one budget
    holds ``fit`` answers: the trials with the retry margin (:func:`planned_queries`), or
    ``fit`` where the whole margin does not fit but the trials do."""

    answers = planned_queries(trials)
    return fit if trials <= fit < answers else answers


def answers_within_budget(epsilon: float, delta: float, limit: float = MAX_BUDGET_EPSILON) -> int:
    """:func:`trials_held` for answers at (epsilon, delta) composed as mu-GDP within a budget
    of at most ``limit``."""

    return trials_held(answers_in_budget(epsilon, delta, limit))


def budgeted_answers(
    epsilon: float, delta: float, trials: int, limit: float = MAX_BUDGET_EPSILON
) -> int:
    """:func:`answers_for_trials` for answers at (epsilon, delta) composed as mu-GDP within a
    budget of at most ``limit``."""

    return answers_for_trials(trials, answers_in_budget(epsilon, delta, limit))
