"""Renyi-DP for noisy argmax (paper 003, Section 4.2 and Appendix B).

Two sides of the same quantity, the order-``alpha`` Renyi divergence between the released
labels on two neighbouring vote histograms:

* :func:`renyi_noisy_argmax_exact`, the mechanism's own value (an upper reference for any
  attack on those histograms). The release probabilities are one-dimensional integrals::

      P(argmax = c) = integral phi(t) prod_{i != c} Phi(t + (n_c - n_i) / sigma) dt

  The log of the integrand is concave with curvature at most -1, so it is bounded by a
  Gaussian of unit width around its mode: we find the mode, integrate ``mode +- 40`` by
  adaptive quadrature in a rescaled (overflow-free) form and keep everything in log space, so
  that probabilities down to 1e-300 still come out with full relative accuracy.
* :func:`rdp_two_cut_lower`, the 2-cut lower bound from an attack's counts (Eq. 3 and its
  Clopper-Pearson form in Appendix B): with ``p1 = TPR`` and ``p2 = FPR``,

      D_alpha >= 1/(alpha-1) log[(p1_l)^alpha (p2_u)^(1-alpha) + (1-p1_u)^alpha (1-p2_l)^(1-alpha)]

  Each term is minimised separately over the confidence box, so the bound holds whenever the
  four one-sided intervals hold (joint confidence shared between them by ``split``). The
  reverse direction (``D_alpha(without || with)``) is bounded from the same four bounds and
  the larger of the two is returned. Renyi divergences of independent queries add, so the
  bound for ``queries`` identical, independent queries is ``queries`` times the per-query one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt
from scipy import integrate, optimize, special

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.stats import (
    ConfidenceSplit,
    Count,
    FloatArray,
    check_delta,
    clopper_pearson_lower,
    clopper_pearson_upper,
    per_interval_confidence,
)

__all__ = [
    "noisy_argmax_log_probabilities",
    "rdp_to_epsilon",
    "rdp_two_cut_lower",
    "renyi_noisy_argmax_exact",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_SPAN = 40.0  # integrate mode +- 40 (the integrand is below exp(-800) of its peak outside)


def _histogram(counts: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(counts, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise InvalidAuditInput(f"{name} must be a 1-D histogram of at least 2 classes")
    if not np.all(np.isfinite(arr)):
        raise InvalidAuditInput(f"{name} must be finite")
    return arr


def _log_release_probability(d: FloatArray) -> float:
    """log of ``integral phi(t) prod_i Phi(t + d_i) dt``."""

    def log_f(t: float) -> float:
        return -0.5 * t * t - _HALF_LOG_2PI + float(np.sum(special.log_ndtr(t + d)))

    def slope(t: float) -> float:  # d/dt log f, strictly decreasing
        x = t + d
        mills = np.exp(-0.5 * x * x - _HALF_LOG_2PI - special.log_ndtr(x))
        return -t + float(np.sum(mills))

    lo, hi = 0.0, 1.0  # slope(0) > 0: the mode is positive
    while slope(hi) > 0.0:
        lo, hi = hi, 2.0 * hi
    mode = optimize.brentq(slope, lo, hi, xtol=1e-12)
    peak = log_f(mode)
    value, _ = integrate.quad(
        lambda t: math.exp(log_f(t) - peak),
        mode - _SPAN,
        mode + _SPAN,
        points=[mode],
        epsabs=0.0,
        epsrel=1e-11,
        limit=500,
    )
    return peak + math.log(value)


def noisy_argmax_log_probabilities(counts: npt.ArrayLike, sigma: float) -> FloatArray:
    """log P(noisy argmax = c) for every class c of ``counts`` with ``N(0, sigma^2)`` noise.

    Normalised to sum to one (ties have probability zero).
    """
    h = _histogram(counts, "counts")
    s = float(sigma)
    if not s > 0.0:
        raise InvalidAuditInput(f"sigma must be positive, got {sigma!r}")
    out = np.empty(h.size, dtype=np.float64)
    for c in range(h.size):
        out[c] = _log_release_probability(np.delete((h[c] - h) / s, c))
    return np.asarray(out - special.logsumexp(out), dtype=np.float64)


def _renyi(lp: FloatArray, lq: FloatArray, alpha: FloatArray) -> FloatArray:
    out = np.empty(alpha.shape, dtype=np.float64)
    for i, a in enumerate(alpha.ravel()):
        if a == 1.0:
            p = np.exp(lp)
            value = float(np.sum(np.where(p > 0.0, p * (lp - lq), 0.0)))
        else:
            value = float(special.logsumexp(a * lp + (1.0 - a) * lq)) / (a - 1.0)
        out.reshape(-1)[i] = max(0.0, value)
    return out


def _orders(alpha: Any, lowest: float, name: str = "alpha") -> FloatArray:
    arr = np.asarray(alpha, dtype=np.float64)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < lowest):
        raise InvalidAuditInput(f"{name} must be finite orders >= {lowest}, got {alpha!r}")
    return arr


@overload
def renyi_noisy_argmax_exact(
    counts_a: npt.ArrayLike, counts_b: npt.ArrayLike, sigma: float, alpha: float
) -> float: ...
@overload
def renyi_noisy_argmax_exact(
    counts_a: npt.ArrayLike,
    counts_b: npt.ArrayLike,
    sigma: float,
    alpha: Sequence[float] | FloatArray,
) -> FloatArray: ...
def renyi_noisy_argmax_exact(
    counts_a: npt.ArrayLike,
    counts_b: npt.ArrayLike,
    sigma: float,
    alpha: float | Sequence[float] | FloatArray,
) -> float | FloatArray:
    """Exact ``D_alpha(argmax(a + Z) || argmax(b + Z))``, ``Z ~ N(0, sigma^2 I)``.

    ``alpha`` >= 1 (1 is the KL divergence); one order gives a float, several an array. For
    the symmetric RDP value of a neighbouring pair take the max over both argument orders.
    """
    a = _histogram(counts_a, "counts_a")
    b = _histogram(counts_b, "counts_b")
    if a.shape != b.shape:
        raise InvalidAuditInput(f"histograms differ in length: {a.size} and {b.size}")
    orders = _orders(alpha, 1.0)
    out = _renyi(
        noisy_argmax_log_probabilities(a, sigma), noisy_argmax_log_probabilities(b, sigma), orders
    )
    if isinstance(alpha, float | int):
        return float(out)
    return out


@overload
def rdp_two_cut_lower(
    tp: Count,
    fn: Count,
    fp: Count,
    tn: Count,
    alpha: float,
    *,
    confidence: float = ...,
    split: ConfidenceSplit = ...,
    queries: int = ...,
) -> float: ...
@overload
def rdp_two_cut_lower(
    tp: Count,
    fn: Count,
    fp: Count,
    tn: Count,
    alpha: Sequence[float] | FloatArray,
    *,
    confidence: float = ...,
    split: ConfidenceSplit = ...,
    queries: int = ...,
) -> FloatArray: ...
def rdp_two_cut_lower(
    tp: Count,
    fn: Count,
    fp: Count,
    tn: Count,
    alpha: float | Sequence[float] | FloatArray,
    *,
    confidence: float = 0.95,
    split: ConfidenceSplit = "bonferroni",
    queries: int = 1,
) -> float | FloatArray:
    """2-cut lower bound on the order-``alpha`` RDP (``alpha > 1``) from an attack's counts.

    ``tp``/``fn`` from trials with the canary, ``fp``/``tn`` without. Four one-sided
    Clopper-Pearson bounds (lower and upper on TPR and on FPR) hold jointly with probability
    ``confidence`` (default Bonferroni: each at ``1 - (1 - confidence) / 4``). ``queries``
    independent repetitions of the audited query multiply the bound (RDP composes additively).
    """
    orders = _orders(alpha, 1.0)
    if np.any(orders <= 1.0):
        raise InvalidAuditInput(f"alpha must be > 1 for the 2-cut bound, got {alpha!r}")
    if queries < 1:
        raise InvalidAuditInput(f"queries must be at least 1, got {queries}")
    for name, v in (("tp", tp), ("fn", fn), ("fp", fp), ("tn", tn)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise InvalidAuditInput(f"{name} must be a non-negative whole number, got {v!r}")
    n1, n2 = int(tp) + int(fn), int(fp) + int(tn)
    if n1 == 0 or n2 == 0:
        raise InvalidAuditInput("need at least one trial with and one without the canary")
    c_each = per_interval_confidence(confidence, 4, split)
    p1l = clopper_pearson_lower(int(tp), n1, c_each)
    p1u = clopper_pearson_upper(int(tp), n1, c_each)
    p2l = clopper_pearson_lower(int(fp), n2, c_each)
    p2u = clopper_pearson_upper(int(fp), n2, c_each)

    def log(x: float) -> float:
        return math.log(x) if x > 0.0 else -math.inf

    def bound(ql: float, qu: float, rl: float, ru: float) -> FloatArray:
        # D(mu_q || mu_r) >= 1/(a-1) log[ql^a ru^(1-a) + (1-qu)^a (1-rl)^(1-a)]
        with np.errstate(all="ignore"):
            first = orders * log(ql) + (1.0 - orders) * log(ru)
            second = orders * log(1.0 - qu) + (1.0 - orders) * log(1.0 - rl)
            value = np.logaddexp(first, second) / (orders - 1.0)
        return np.asarray(np.where(np.isnan(value), 0.0, value), dtype=np.float64)

    forward = bound(p1l, p1u, p2l, p2u)  # D(with || without)
    backward = bound(p2l, p2u, p1l, p1u)  # D(without || with)
    out = queries * np.maximum(np.maximum(forward, backward), 0.0)
    if isinstance(alpha, float | int):
        return float(out)
    return np.asarray(out, dtype=np.float64)


def rdp_to_epsilon(
    orders: Sequence[float] | FloatArray, rdp: Sequence[float] | FloatArray, delta: float
) -> float:
    """(epsilon, delta)-DP implied by RDP values at several orders (an *upper* bound).

    Theorem 1 of paper 003 (Balle et al. 2020, Thm. 20):
    ``epsilon = eps_alpha + log((alpha - 1) / alpha) - (log delta + log alpha) / (alpha - 1)``,
    minimised over the orders. Use it on theory or exact RDP curves; it does not turn an RDP
    *lower* bound into a DP lower bound.
    """
    a = _orders(orders, 1.0, "orders")
    r = np.asarray(rdp, dtype=np.float64)
    if r.shape != a.shape:
        raise InvalidAuditInput(f"orders and rdp differ in shape: {a.shape} and {r.shape}")
    if np.any(a <= 1.0):
        raise InvalidAuditInput("orders must be > 1")
    d = check_delta(delta)
    eps = r + np.log((a - 1.0) / a) - (math.log(d) + np.log(a)) / (a - 1.0)
    return max(0.0, float(np.min(eps)))
