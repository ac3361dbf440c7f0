"""Gaussian differential privacy (GDP): the (epsilon, delta) curve of mu-GDP and the audit's
lower bound on mu (paper 000, Section 2; Dong, Roth and Su 2022).

A mechanism is mu-GDP when telling its outputs on two neighbours apart is at least as hard as
telling ``N(0, 1)`` from ``N(mu, 1)``. The Gaussian mechanism with L2 sensitivity ``Delta`` and
noise ``sigma`` is exactly ``mu = Delta / sigma``-GDP, and mu-GDP is (epsilon, delta)-DP for
every epsilon with::

    delta(epsilon; mu) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)

An attack with false-positive rate FPR and false-negative rate FNR proves
``mu >= Phi^-1(1 - FNR) - Phi^-1(FPR)``; with one-sided Clopper-Pearson upper bounds on both
rates the bound holds with the stated confidence (how the confidence is split between the two
intervals: :mod:`dpicl_audit.estimators.stats`).
"""

from __future__ import annotations

import math
from typing import Any, overload

import numpy as np
import numpy.typing as npt
from scipy import optimize, special

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.stats import (
    ConfidenceSplit,
    Count,
    FloatArray,
    check_delta,
    clopper_pearson_upper,
    per_interval_confidence,
)

__all__ = ["gdp_delta", "gdp_epsilon", "gdp_mu", "mu_from_rates", "mu_lower"]


def _log_gdp_delta(epsilon: float, mu: float) -> float:
    """log delta(epsilon; mu) for mu > 0, computed in log space (no underflow for tiny delta)."""
    if math.isinf(mu):
        return 0.0
    la = float(special.log_ndtr(-epsilon / mu + mu / 2.0))
    lb = epsilon + float(special.log_ndtr(-epsilon / mu - mu / 2.0))
    diff = lb - la
    if diff >= 0.0:  # only by rounding: delta is non-negative
        return -math.inf
    return la + math.log(-math.expm1(diff))


@overload
def gdp_delta(epsilon: float, mu: float) -> float: ...
@overload
def gdp_delta(epsilon: FloatArray | float, mu: FloatArray | float) -> FloatArray | float: ...
def gdp_delta(epsilon: FloatArray | float, mu: FloatArray | float) -> FloatArray | float:
    """delta(epsilon; mu) of mu-GDP; broadcasts over arrays, a float for scalar inputs.

    Stable for tiny deltas (log-space difference of the two normal tails). ``mu <= 0`` (the
    two output distributions are equal) gives ``max(0, 1 - e^epsilon)``; ``mu = inf`` gives 1.
    """
    e, m = np.broadcast_arrays(
        np.asarray(epsilon, dtype=np.float64), np.asarray(mu, dtype=np.float64)
    )
    if np.any(np.isnan(e)) or np.any(np.isnan(m)):
        raise InvalidAuditInput("epsilon and mu must not be NaN")
    positive = m > 0.0
    ms = np.where(positive, m, 1.0)
    with np.errstate(all="ignore"):
        la = special.log_ndtr(-e / ms + ms / 2.0)
        lb = e + special.log_ndtr(-e / ms - ms / 2.0)
        diff = lb - la
        shifted = np.where(diff < 0.0, np.exp(la) * -np.expm1(np.minimum(diff, 0.0)), 0.0)
        same = np.maximum(0.0, -np.expm1(e))
    out = np.where(positive, shifted, same)
    if isinstance(epsilon, float | int) and isinstance(mu, float | int):
        return float(out)
    return np.asarray(out, dtype=np.float64)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon >= 0 with ``delta(epsilon; mu) <= delta`` (0 when ``mu <= 0``).

    Solved by Brent's method on ``log delta(epsilon; mu) - log delta`` (decreasing in epsilon).
    """
    d = check_delta(delta)
    m = float(mu)
    if math.isnan(m):
        raise InvalidAuditInput("mu must not be NaN")
    if m <= 0.0:
        return 0.0
    if math.isinf(m):
        return math.inf
    target = math.log(d)
    if _log_gdp_delta(0.0, m) <= target:
        return 0.0
    hi = max(1.0, m * m / 2.0 + m * math.sqrt(2.0 * math.log(1.0 / d)))
    while _log_gdp_delta(hi, m) > target:
        hi *= 2.0
    root = optimize.brentq(
        lambda e: _log_gdp_delta(e, m) - target, 0.0, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps
    )
    return float(root)


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest mu with ``delta(epsilon; mu) <= delta``: the inverse of :func:`gdp_epsilon`.

    ``sensitivity / gdp_mu(epsilon, delta)`` is the smallest Gaussian noise that gives
    (epsilon, delta)-DP (the analytic Gaussian mechanism of Balle and Wang 2018).
    """
    d = check_delta(delta)
    e = float(epsilon)
    if not e >= 0.0:
        raise InvalidAuditInput(f"epsilon must be non-negative, got {epsilon!r}")
    target = math.log(d)
    lo, hi = 0.5, 1.0  # bracket the root: delta(e; lo) < delta <= delta(e; hi)
    while _log_gdp_delta(e, hi) < target:  # delta grows with mu
        lo, hi = hi, 2.0 * hi
    while _log_gdp_delta(e, lo) >= target:
        lo, hi = lo / 2.0, lo
    root = optimize.brentq(
        lambda m: _log_gdp_delta(e, m) - target, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps
    )
    return float(root)


def mu_from_rates(fpr_upper: Any, fnr_upper: Any) -> FloatArray:
    """``Phi^-1(1 - FNR_u) - Phi^-1(FPR_u)`` clipped at 0, from given upper bounds (vectorised)."""
    fpr = np.asarray(fpr_upper, dtype=np.float64)
    fnr = np.asarray(fnr_upper, dtype=np.float64)
    with np.errstate(all="ignore"):
        mu = -(special.ndtri(fnr) + special.ndtri(fpr))
    return np.asarray(np.where(np.isnan(mu), 0.0, np.maximum(mu, 0.0)), dtype=np.float64)


@overload
def mu_lower(
    fp: Count,
    n_neg: Count,
    fn: Count,
    n_pos: Count,
    confidence: float = ...,
    *,
    split: ConfidenceSplit = ...,
) -> float: ...
@overload
def mu_lower(
    fp: npt.NDArray[Any],
    n_neg: Count | npt.NDArray[Any],
    fn: npt.NDArray[Any],
    n_pos: Count | npt.NDArray[Any],
    confidence: float = ...,
    *,
    split: ConfidenceSplit = ...,
) -> FloatArray: ...
def mu_lower(
    fp: Count | npt.NDArray[Any],
    n_neg: Count | npt.NDArray[Any],
    fn: Count | npt.NDArray[Any],
    n_pos: Count | npt.NDArray[Any],
    confidence: float = 0.95,
    *,
    split: ConfidenceSplit = "bonferroni",
) -> FloatArray | float:
    """Lower confidence bound on mu: ``Phi^-1(1 - FNR_upper) - Phi^-1(FPR_upper)``, clipped at 0.

    ``FPR_upper`` and ``FNR_upper`` are one-sided Clopper-Pearson upper bounds on
    ``fp / n_neg`` and ``fn / n_pos``. ``confidence`` is the *joint* confidence of the bound;
    ``split`` says how it is shared between the two intervals (default Bonferroni: each at
    ``1 - (1 - confidence) / 2``, e.g. 97.5% each for a 95% bound). Vectorised over arrays
    of counts (a float for scalar inputs).
    """
    c_each = per_interval_confidence(confidence, 2, split)
    fpr_u = np.asarray(clopper_pearson_upper(np.asarray(fp), np.asarray(n_neg), c_each))
    fnr_u = np.asarray(clopper_pearson_upper(np.asarray(fn), np.asarray(n_pos), c_each))
    mu = mu_from_rates(fpr_u, fnr_u)
    if all(isinstance(x, int | np.integer) for x in (fp, n_neg, fn, n_pos)):
        return float(mu)
    return np.asarray(mu, dtype=np.float64)
