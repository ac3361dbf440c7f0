"""White-box diagnostics of DPS-MOZO (:mod:`dpicl.mechanisms.dps_mozo.release`): the divergences a
released token actually has, to set beside the guarantees.

* :func:`exact_shot_log_ratio`: the proven mode's per-shot max log-ratio, at most
  ``2 eps0`` when the mechanism is right;
* :func:`exact_shot_divergence` and :func:`product_divergence`: the Renyi divergences the
  paper's mode actually has, against its false per-token claim (Theorem B.3; the caveat in
  :mod:`dpicl.mechanisms.dps_mozo.release`).

Pure numpy functions over logits on the public top-k support.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpicl.mechanisms.dps_mozo.release import (
    FloatArray,
    log_softmax,
    max_log_ratio,
    product_distribution,
    symmetric_divergence,
)

__all__ = ["exact_shot_divergence", "exact_shot_log_ratio", "product_divergence"]


def _log_neighbours(
    mixed: npt.ArrayLike, zero_logits: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """``log P`` (``(k,)``), the released product, and ``log P_i`` (``(n_shots, k)``), the
    product with shot ``i`` replaced by the zero-shot distribution."""
    m = np.asarray(mixed, dtype=np.float64)
    zero = np.asarray(zero_logits, dtype=np.float64)
    if m.ndim != 2 or zero.ndim != 1 or m.shape[1] != zero.shape[0]:
        raise ValueError(f"expected (n_shots, k) and (k,), got {m.shape} and {zero.shape}")
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(zero))):
        raise ValueError("logits on the top-k support must be finite")
    log_mixed = log_softmax(m)
    log_total = log_mixed.sum(axis=0)
    log_p = log_softmax(log_total)
    log_neighbours = log_softmax(log_total[None, :] - log_mixed + log_softmax(zero)[None, :])
    return log_p, log_neighbours


def exact_shot_log_ratio(mixed: npt.ArrayLike, zero_logits: npt.ArrayLike) -> FloatArray:
    """White-box diagnostic of the proven bound: for each shot ``i`` (shape ``(n_shots,)``),
    ``max_y |log P(y) - log P_i(y)|`` between the released product ``P`` and ``P_i``, the
    product with shot ``i`` replaced by the zero-shot distribution. In the proven mode it is
    at most ``2 eps0`` (one factor moves by ``eps0``, the normaliser by at most ``eps0``),
    half the per-token bound ``4 eps0``, which also covers a neighbour's arbitrary
    replacement (docs/privacy.md)."""
    log_p, log_neighbours = _log_neighbours(mixed, zero_logits)
    return max_log_ratio(log_p[None, :], log_neighbours)


def exact_shot_divergence(
    mixed: npt.ArrayLike, zero_logits: npt.ArrayLike, alpha: float
) -> FloatArray:
    """White-box diagnostic: for each shot ``i``, the Renyi divergences at ``alpha`` (both
    directions, shape ``(n_shots, 2)``) between the released distribution
    ``P ∝ prod_j mixed_j`` and ``P_i ∝ zero * prod_{j != i} mixed_j``, the same product with
    shot ``i`` replaced by the zero-shot distribution (a demonstration that moves nothing).

    Theorem B.3 bounds the divergence between neighbouring outputs by ``4 * beta * alpha``
    through Theorems B.1-B.2, but B.2 (additivity) is about product *measures*, while Line 16
    samples from a *normalised pointwise* product, for which the normalisers can add to the
    divergence; this function measures the exact value so the two can be compared.
    """
    log_p, log_neighbours = _log_neighbours(mixed, zero_logits)
    return symmetric_divergence(log_p[None, :], log_neighbours, alpha)


def product_divergence(mixed_a: npt.ArrayLike, mixed_b: npt.ArrayLike, alpha: float) -> FloatArray:
    """``(D_alpha(P_a || P_b), D_alpha(P_b || P_a))`` (shape ``(2,)``) between the released
    distributions :func:`product_distribution` of two sets of mixed logits, e.g. those of two
    neighbouring contexts (compare with the claimed per-token RDP ``4 * beta * alpha``)."""
    log_a = np.log(product_distribution(mixed_a))
    log_b = np.log(product_distribution(mixed_b))
    return symmetric_divergence(log_a, log_b, alpha)
