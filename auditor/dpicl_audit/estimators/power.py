"""Power of an audit design: the largest epsilon_emp it could reach with a given number of trials.

An audit whose design cannot separate the worlds proves nothing, and "consistent with the
claim" would then be a false statement. This module computes, before or after a run, the bound
the audit would report if its counts equalled their expectations under a stated model of the
design:

* a fraction ``flip_rate`` of the trials (the clean signal differs between the worlds: the
  canary changed the clean vote, or the partition output); in the rest both worlds produce
  the same output distribution, so no attack can tell them apart there;
* where the signal differs, the attack's score is shifted by ``mu`` (the mechanism's own
  ``Delta / sigma`` for a Gaussian mechanism; ``inf`` = perfect separation).

Scores are modelled as ``N(0, 1)`` without the canary and the mixture
``(1 - q) N(0, 1) + q N(mu, 1)`` with it; the attack "positive iff score > tau" has
``FPR = Phi(-tau)`` and ``TPR = (1 - q) Phi(-tau) + q Phi(mu - tau)``. The reachable bound is
the largest over a grid of ``tau`` of the bound (GDP epsilon or classical) at the rounded
expected counts, with the audit's own confidence. It is a typical value, not a guarantee:
the realised bound fluctuates around it. With ``flip_rate = 1`` and ``mu = inf`` it is the
ceiling that the number of trials alone sets (perfect separation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.classic import classic_epsilon_from_rates
from dpicl_audit.estimators.counts import estimate_from_counts
from dpicl_audit.estimators.gdp import gdp_epsilon, mu_from_rates
from dpicl_audit.estimators.stats import (
    ConfidenceSplit,
    check_confidence,
    check_delta,
    clopper_pearson_upper,
    per_interval_confidence,
)

__all__ = [
    "Figure",
    "ReachablePower",
    "flip_rate_from_signals",
    "max_reachable_epsilon",
    "reachable_from_rates",
    "trials_for_power",
]

Figure = Literal["gdp", "classical"]

_TAUS = np.linspace(-8.0, 12.0, 401)


@dataclass(frozen=True)
class ReachablePower:
    """The best expected bound of a design and the attack that reaches it.

    ``epsilon`` is at ``delta`` for ``figure``; ``mu`` is the GDP lower bound there (also for
    the classical figure, for reference); ``tpr``/``fpr`` the modelled rates of the best
    threshold; ``n_pos``/``n_neg`` the trials per world.
    """

    figure: Figure
    epsilon: float
    mu: float
    tpr: float
    fpr: float
    n_pos: int
    n_neg: int
    flip_rate: float
    signal_mu: float


def _trials(n: int, name: str) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise InvalidAuditInput(f"{name} must be a positive whole number, got {n!r}")
    return int(n)


def max_reachable_epsilon(
    n_pos: int,
    n_neg: int,
    *,
    delta: float,
    confidence: float = 0.95,
    flip_rate: float = 1.0,
    mu: float = math.inf,
    figure: Figure = "classical",
    split: ConfidenceSplit = "bonferroni",
) -> ReachablePower:
    """The largest bound the design could reach with ``n_pos``/``n_neg`` trials (module doc).

    ``flip_rate`` in [0, 1]: the fraction of trials whose clean signal differs between the
    worlds (0: no audit can see anything, the result is 0). ``mu >= 0``: the separation where
    it differs (``inf``: perfect). ``figure``: ``"classical"`` (assumption-free) or ``"gdp"``
    (epsilon of the mu lower bound, assuming a Gaussian trade-off).
    """
    npos, nneg = _trials(n_pos, "n_pos"), _trials(n_neg, "n_neg")
    q = float(flip_rate)
    if not 0.0 <= q <= 1.0:
        raise InvalidAuditInput(f"flip_rate must lie in [0, 1], got {flip_rate!r}")
    m = float(mu)
    if math.isnan(m) or m < 0.0:
        raise InvalidAuditInput(f"mu must be non-negative, got {mu!r}")
    if figure not in ("gdp", "classical"):
        raise InvalidAuditInput(f"figure must be 'gdp' or 'classical', got {figure!r}")
    d = check_delta(delta)
    c_each = per_interval_confidence(check_confidence(confidence), 2, split)
    fpr = special.ndtr(-_TAUS)
    shifted = np.ones_like(_TAUS) if math.isinf(m) else special.ndtr(m - _TAUS)
    tpr = (1.0 - q) * fpr + q * shifted
    fp = np.round(fpr * nneg)
    fn = np.round((1.0 - tpr) * npos)
    fpr_u = clopper_pearson_upper(fp, nneg, c_each)
    fnr_u = clopper_pearson_upper(fn, npos, c_each)
    mus = mu_from_rates(fpr_u, fnr_u)
    if figure == "classical":
        values = classic_epsilon_from_rates(fpr_u, fnr_u, d)
    else:
        best_mu = int(np.argmax(mus))  # the GDP epsilon increases with mu
        values = np.zeros_like(mus)
        values[best_mu] = gdp_epsilon(float(mus[best_mu]), d)
    k = int(np.argmax(values))
    return ReachablePower(
        figure=figure,
        epsilon=float(values[k]),
        mu=float(mus[k]),
        tpr=float(tpr[k]),
        fpr=float(fpr[k]),
        n_pos=npos,
        n_neg=nneg,
        flip_rate=q,
        signal_mu=m,
    )


def reachable_from_rates(
    n_pos: int,
    n_neg: int,
    tpr: float,
    fpr: float,
    *,
    delta: float,
    confidence: float = 0.95,
    figure: Figure = "gdp",
) -> float:
    """The bound a *fixed* decision with true rates ``tpr``/``fpr`` reports at its rounded
    expected counts: the reachable epsilon of a black-box design whose rates are known in
    closed form (e.g. :func:`~dpicl_audit.estimators.label_release.pivotal_rates`)."""
    npos, nneg = _trials(n_pos, "n_pos"), _trials(n_neg, "n_neg")
    for name, v in (("tpr", tpr), ("fpr", fpr)):
        if not 0.0 <= float(v) <= 1.0:
            raise InvalidAuditInput(f"{name} must be a probability, got {v!r}")
    if figure not in ("gdp", "classical"):
        raise InvalidAuditInput(f"figure must be 'gdp' or 'classical', got {figure!r}")
    tp, fp = round(float(tpr) * npos), round(float(fpr) * nneg)
    est = estimate_from_counts(tp, npos - tp, fp, nneg - fp, delta=delta, confidence=confidence)
    return est.epsilon_lower if figure == "gdp" else est.epsilon_lower_classic


#: The most trials :func:`trials_for_power` looks at (in all, both worlds).
MAX_SEARCHED_TRIALS = 10**8


def trials_for_power(
    reach: Callable[[int, int], float],
    target: float,
    *,
    n_pos: int,
    n_neg: int,
    max_trials: int = MAX_SEARCHED_TRIALS,
) -> tuple[int, int] | None:
    """About how many trials the design needs for ``reach(n_pos, n_neg) >= target``: the
    smallest counts in the proportion ``n_pos : n_neg`` (so an audit's advice scales its own
    split of the worlds), or ``None`` when ``max_trials`` in all still fall short.

    ``reach`` is the design's reachable bound at given counts (:func:`max_reachable_epsilon`,
    :func:`reachable_from_rates`, or the better of several tests). It grows with the counts
    up to the rounding of its expected counts, so the answer is found by doubling and then
    bisection over a common scale factor, and is "about": a neighbouring count may reach
    the target too.
    """
    npos, nneg = _trials(n_pos, "n_pos"), _trials(n_neg, "n_neg")
    limit = _trials(max_trials, "max_trials")
    goal = float(target)
    if math.isnan(goal):
        raise InvalidAuditInput("target must be a number, got NaN")

    def counts(scale: float) -> tuple[int, int]:
        return max(1, math.ceil(scale * npos)), max(1, math.ceil(scale * nneg))

    def enough(scale: float) -> bool:
        return reach(*counts(scale)) >= goal

    lo, hi = 0.0, 1.0
    while not enough(hi):
        lo, hi = hi, 2.0 * hi
        if sum(counts(lo)) >= limit:
            return None
    # Invariant: counts(hi) reach the target, counts(lo) do not (or lo == 0).
    while sum(counts(hi)) - sum(counts(lo)) > 1:
        mid = 0.5 * (lo + hi)
        if counts(mid) in (counts(lo), counts(hi)):
            break
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    best = counts(hi)
    return best if sum(best) <= limit else None


def flip_rate_from_signals(signals_with: np.ndarray, signals_without: np.ndarray) -> float:
    """Fraction of paired clean signals (row i of each: the same design draw in both worlds)
    that differ between the worlds: clean vote vectors, partition outputs, or any array."""
    a = np.asarray(signals_with)
    b = np.asarray(signals_without)
    if a.shape != b.shape or a.ndim < 1 or a.shape[0] == 0:
        raise InvalidAuditInput(
            f"paired signals need the same non-empty shape, got {a.shape} and {b.shape}"
        )
    differ = np.any(a.reshape(a.shape[0], -1) != b.reshape(b.shape[0], -1), axis=1)
    return float(np.mean(differ))
