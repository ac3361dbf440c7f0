"""Renyi-DP audits of query sequences (paper 003, Sections 4.2 and 5, Appendix B), vectorised.

Pure numpy functions over arrays; :mod:`.rdp` keeps the scalar reference forms.

* :func:`argmax_log_probs` - ``log P(argmax(h + N(0, sigma^2 I)) = c)`` for a whole batch of
  histograms at once: the 1-D integral of Section 4.2,
  ``P(c) = int phi(t) prod_{i != c} Phi(t + (n_c - n_i)/sigma) dt``, evaluated in log space
  by the trapezoidal rule on one fine grid (step 0.01 over ``[-40, 40 + max gap]``). The
  integrand is smooth and decays like a Gaussian, where the trapezoidal rule converges
  geometrically; :func:`dpicl_audit.estimators.rdp.noisy_argmax_log_probabilities`
  (adaptive quadrature around the mode) and Monte Carlo are the independent checks in the
  tests.
* :func:`exact_rdp` - the exact divergence of every query's noisy argmax between its two
  histograms ("exact theory"), the larger of the two directions, per order.
* :func:`gaussian_rdp` - the Gaussian mechanism's RDP ``alpha Delta^2 / (2 sigma^2)``
  (Mironov 2017, Prop. 7), Delta = sqrt(2) for one moved vote ("theory").
* :func:`two_cut_from_labels` / :func:`k_cut_lower` - lower bounds from released labels: the
  2-cut of Eq. (3) with Clopper-Pearson (Appendix B) on an output set fixed *before* the
  counts are looked at, and the k-cut of Appendix B over the labels themselves with one
  Clopper-Pearson interval per cell, Bonferroni over all ``2 k`` cells (a finite-sample
  valid replacement of the asymptotic Goodman / Sison-Glaz intervals the paper uses).
* :func:`simulate_label_counts` - released-label counts of ``n`` noisy argmaxes of one
  histogram, chunked (memory ``chunk x classes``); the Monte-Carlo audit of Figure 2/6.

Composition over the N queries of a sequence is the order-wise sum (RDP composes without
loss, Mironov 2017 Prop. 1); the conversion to (epsilon, delta) is
:func:`dpicl_audit.estimators.rdp.rdp_to_epsilon` (Theorem 1 of 003), an *upper*-bound map
that the paper uses for illustration only: the converted figure of a lower bound is not a
lower bound on epsilon, and the results say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy import special

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.rdp import rdp_two_cut_lower
from dpicl_audit.estimators.stats import (
    FloatArray,
    IntArray,
    clopper_pearson_lower,
    clopper_pearson_upper,
    per_interval_confidence,
)

__all__ = [
    "DEFAULT_ORDERS",
    "argmax_log_probs",
    "best_output_label",
    "exact_rdp",
    "gaussian_rdp",
    "k_cut_lower",
    "renyi_from_log_probs",
    "simulate_label_counts",
    "two_cut_from_labels",
]

#: The orders grid of the paper's plots (003, Figure 2), refined.
DEFAULT_ORDERS: tuple[float, ...] = (1.5, 2.0, 3.0, 5.0, 8.0, 10.0, 16.0, 20.0, 32.0, 50.0, 64.0)
_STEP = 0.01
_SPAN = 40.0
_MAX_GRID = 2_000_000  # grid points x terms per chunk; bounds the memory of one chunk
_MAX_GAP = 1e4  # vote gaps / sigma beyond this are refused (grid length)


def _orders(orders: npt.ArrayLike) -> FloatArray:
    a = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 1.0):
        raise InvalidAuditInput(f"orders must be finite numbers > 1, got {orders!r}")
    return a


def _hists(h: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(h, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] < 2 or arr.shape[0] == 0:
        raise InvalidAuditInput(f"{name} must be histograms of at least 2 classes")
    if not np.all(np.isfinite(arr)):
        raise InvalidAuditInput(f"{name} must be finite")
    return arr


def argmax_log_probs(hists: npt.ArrayLike, sigma: float) -> FloatArray:
    """``log P(noisy argmax = c)`` for each row of ``hists`` (shape ``(m, C)`` or ``(C,)``).

    Returns shape ``(m, C)``, each row normalised (ties have probability zero).
    """
    h = _hists(hists, "hists")
    s = float(sigma)
    if not (s > 0.0 and math.isfinite(s)):
        raise InvalidAuditInput(f"sigma must be positive and finite, got {sigma!r}")
    m, c = h.shape
    # d[j, c, i] = (n_c - n_i) / sigma; the term i == c is +inf (log Phi = 0).
    d = (h[:, :, None] - h[:, None, :]) / s
    eye = np.eye(c, dtype=bool)
    gap = float(np.max(-np.where(eye[None], 0.0, d))) if c > 1 else 0.0
    if gap > _MAX_GAP:
        raise InvalidAuditInput(f"vote gaps of {gap:.0f} sigma are too large to integrate")
    t = np.arange(-_SPAN, _SPAN + max(gap, 0.0) + _STEP, _STEP)
    log_phi = -0.5 * t * t - 0.5 * math.log(2.0 * math.pi)
    out = np.empty((m, c), dtype=np.float64)
    rows = max(1, _MAX_GRID // (t.size * c * c))
    for lo in range(0, m, rows):
        dd = np.where(eye[None], np.inf, d[lo : lo + rows])  # (r, C, C)
        terms = special.log_ndtr(t[None, None, None, :] + dd[..., None])  # (r, C, C, G)
        log_f = log_phi + terms.sum(axis=2)  # (r, C, G)
        # trapezoid on a decaying integrand: the end points are ~0, so a plain sum * step
        out[lo : lo + rows] = special.logsumexp(log_f, axis=-1) + math.log(_STEP)
    return np.asarray(out - special.logsumexp(out, axis=1, keepdims=True), dtype=np.float64)


def renyi_from_log_probs(lp: FloatArray, lq: FloatArray, orders: npt.ArrayLike) -> FloatArray:
    """``D_alpha(P || Q)`` for rows of log-probabilities ``(m, C)``: shape ``(m, A)``."""
    a = _orders(orders)
    lp2, lq2 = np.atleast_2d(lp), np.atleast_2d(lq)
    with np.errstate(invalid="ignore"):
        x = a[None, :, None] * lp2[:, None, :] + (1.0 - a[None, :, None]) * lq2[:, None, :]
        x = np.where(np.isneginf(lp2)[:, None, :], -np.inf, x)
    value = special.logsumexp(x, axis=-1) / (a - 1.0)[None, :]
    return np.asarray(np.maximum(value, 0.0), dtype=np.float64)


def exact_rdp(
    h1: npt.ArrayLike, h0: npt.ArrayLike, sigma: float, orders: npt.ArrayLike
) -> FloatArray:
    """Exact RDP of each query: ``max(D_a(M(h1)||M(h0)), D_a(M(h0)||M(h1)))``, ``(m, A)``."""
    a, b = _hists(h1, "h1"), _hists(h0, "h0")
    if a.shape != b.shape:
        raise InvalidAuditInput(
            f"h1 and h0 differ in shape: {a.shape[-1]} and {b.shape[-1]} classes"
            if a.shape[0] == b.shape[0]
            else f"h1 and h0 differ in shape: {a.shape} and {b.shape}"
        )
    l1, l0 = argmax_log_probs(a, sigma), argmax_log_probs(b, sigma)
    return np.maximum(renyi_from_log_probs(l1, l0, orders), renyi_from_log_probs(l0, l1, orders))


def gaussian_rdp(
    orders: npt.ArrayLike, sigma: float, sensitivity: float = math.sqrt(2.0)
) -> FloatArray:
    """The Gaussian mechanism's RDP ``alpha Delta^2 / (2 sigma^2)`` (one query)."""
    a = _orders(orders)
    if not float(sigma) > 0.0:
        raise InvalidAuditInput(f"sigma must be positive, got {sigma!r}")
    return np.asarray(a * float(sensitivity) ** 2 / (2.0 * float(sigma) ** 2), dtype=np.float64)


def _check_counts(counts: npt.ArrayLike, name: str) -> IntArray:
    arr = np.asarray(counts)
    if arr.ndim != 1 or arr.size < 2 or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidAuditInput(f"{name} must be a 1-D array of label counts")
    if np.any(arr < 0) or int(arr.sum()) == 0:
        raise InvalidAuditInput(f"{name} must be non-negative with at least one trial")
    return np.asarray(arr, dtype=np.int64)


def k_cut_lower(
    counts1: npt.ArrayLike,
    counts0: npt.ArrayLike,
    orders: npt.ArrayLike,
    *,
    confidence: float = 0.95,
) -> FloatArray:
    """k-cut lower bound (Appendix B of 003) over the released labels, both directions.

    ``1/(a-1) log sum_i p1_l(i)^a p0_u(i)^(1-a)``: each term is smallest at the lower bound
    of the first and the upper bound of the second probability (``a > 1``); ``2 C``
    one-sided Clopper-Pearson intervals, Bonferroni, hold jointly at ``confidence``.
    """
    a = _orders(orders)
    c1, c0 = _check_counts(counts1, "counts1"), _check_counts(counts0, "counts0")
    if c1.shape != c0.shape:
        raise InvalidAuditInput(f"label counts differ in length: {c1.size} and {c0.size}")
    each = per_interval_confidence(confidence, 4 * c1.size, "bonferroni")
    n1, n0 = int(c1.sum()), int(c0.sum())
    lo1 = np.asarray(clopper_pearson_lower(c1, np.full_like(c1, n1), each))
    up1 = np.asarray(clopper_pearson_upper(c1, np.full_like(c1, n1), each))
    lo0 = np.asarray(clopper_pearson_lower(c0, np.full_like(c0, n0), each))
    up0 = np.asarray(clopper_pearson_upper(c0, np.full_like(c0, n0), each))

    def bound(pl: FloatArray, qu: FloatArray) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            x = a[:, None] * np.log(pl)[None, :] + (1.0 - a[:, None]) * np.log(qu)[None, :]
        x = np.where(np.isnan(x), -np.inf, x)
        v = special.logsumexp(x, axis=1) / (a - 1.0)
        return np.asarray(np.maximum(np.nan_to_num(v, nan=0.0, neginf=0.0), 0.0))

    return np.asarray(np.maximum(bound(lo1, up0), bound(lo0, up1)), dtype=np.float64)


def two_cut_from_labels(
    counts1: npt.ArrayLike,
    counts0: npt.ArrayLike,
    output: int,
    orders: npt.ArrayLike,
    *,
    confidence: float = 0.95,
) -> FloatArray:
    """2-cut lower bound (Eq. 3, Appendix B) for the output set ``{label == output}``.

    ``output`` must be fixed before the counts are seen (e.g. by :func:`best_output_label`
    on the clean histograms, or the design's poison label); otherwise the bound is
    optimistic.
    """

    c1, c0 = _check_counts(counts1, "counts1"), _check_counts(counts0, "counts0")
    if not 0 <= output < c1.size:
        raise InvalidAuditInput(f"output label index {output} outside 0..{c1.size - 1}")
    tp, fp = int(c1[output]), int(c0[output])
    return np.asarray(
        rdp_two_cut_lower(
            tp, int(c1.sum()) - tp, fp, int(c0.sum()) - fp, _orders(orders), confidence=confidence
        ),
        dtype=np.float64,
    )


def best_output_label(h1: npt.ArrayLike, h0: npt.ArrayLike, sigma: float, order: float) -> int:
    """The label whose 2-cut ``{label}`` has the largest divergence at ``order``, computed
    from the clean histograms' exact probabilities (never from audit samples)."""
    l1, l0 = argmax_log_probs(h1, sigma)[0], argmax_log_probs(h0, sigma)[0]
    p, q = np.exp(l1), np.exp(l0)
    a = float(order)
    best, best_v = 0, -np.inf
    for c in range(p.size):
        for x, y in ((p[c], q[c]), (q[c], p[c])):
            with np.errstate(all="ignore"):
                v = np.log(x**a * y ** (1 - a) + (1 - x) ** a * (1 - y) ** (1 - a)) / (a - 1)
            if np.isfinite(v) and v > best_v:
                best, best_v = c, float(v)
    return best


def simulate_label_counts(
    hist: Sequence[float] | FloatArray,
    sigma: float,
    n: int,
    rng: np.random.Generator,
    *,
    chunk: int = 1_000_000,
) -> IntArray:
    """Counts of each released label over ``n`` noisy argmaxes of ``hist`` (chunked)."""
    h = _hists(hist, "hist")[0]
    if n < 1 or chunk < 1:
        raise InvalidAuditInput(f"n and chunk must be positive, got {n} and {chunk}")
    counts = np.zeros(h.size, dtype=np.int64)
    done = 0
    while done < n:
        k = min(chunk, n - done)
        noisy = h[None, :] + rng.normal(0.0, float(sigma), size=(k, h.size))
        counts += np.bincount(np.argmax(noisy, axis=1), minlength=h.size)
        done += k
    return counts
