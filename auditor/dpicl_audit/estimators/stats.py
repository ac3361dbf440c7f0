"""Exact binomial confidence bounds (Clopper-Pearson) and the confidence bookkeeping.

Every empirical privacy bound in the auditor is a function of a few binomial proportions
(the false-positive and false-negative rates of an attack). A bound holds with confidence
``c`` when *all* of the one-sided intervals it uses hold at once. How the joint confidence
``c`` is shared between the ``m`` intervals is explicit (:data:`ConfidenceSplit`):

``"bonferroni"`` (the default)
    each interval at ``1 - (1 - c) / m``. A union bound: valid whatever the dependence
    between the intervals.
``"independent"``
    each interval at ``c ** (1 / m)``. Valid when the intervals come from independent
    samples (the two worlds of an audit are independent runs of the mechanism); a hair
    tighter than Bonferroni.
``"per_interval"``
    each interval at ``c`` itself; the joint confidence is then only about ``c ** m``
    (``1 - m (1 - c)`` in the worst case). This is how a "95% lower bound" is often reported
    (paper 000 cites [11] with 95%); offered to reproduce such numbers, never the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt
from scipy import special

from dpicl_audit.errors import InvalidAuditInput

__all__ = [
    "BoolArray",
    "ConfidenceSplit",
    "Count",
    "FloatArray",
    "IntArray",
    "check_confidence",
    "check_delta",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "per_interval_confidence",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ConfidenceSplit = Literal["bonferroni", "independent", "per_interval"]

_SPLITS: tuple[str, ...] = ("bonferroni", "independent", "per_interval")
Count = int | np.integer[Any]


def check_confidence(confidence: float, name: str = "confidence") -> float:
    """Return ``confidence`` as a float, or raise :class:`InvalidAuditInput` unless in (0, 1)."""
    value = float(confidence)
    if not 0.0 < value < 1.0:  # also rejects NaN
        raise InvalidAuditInput(f"{name} must lie strictly between 0 and 1, got {confidence!r}")
    return value


def check_delta(delta: float, name: str = "delta") -> float:
    """Return ``delta`` as a float, or raise :class:`InvalidAuditInput` unless in (0, 1)."""
    value = float(delta)
    if not 0.0 < value < 1.0:
        raise InvalidAuditInput(f"{name} must lie strictly between 0 and 1, got {delta!r}")
    return value


def per_interval_confidence(
    confidence: float, n_intervals: int, split: ConfidenceSplit = "bonferroni"
) -> float:
    """The confidence each of ``n_intervals`` one-sided intervals needs for a joint ``confidence``.

    See the module docstring for the three rules.
    """
    c = check_confidence(confidence)
    if n_intervals < 1:
        raise InvalidAuditInput(f"n_intervals must be at least 1, got {n_intervals}")
    if split == "bonferroni":
        return 1.0 - (1.0 - c) / n_intervals
    if split == "independent":
        return float(c ** (1.0 / n_intervals))
    if split == "per_interval":
        return c
    raise InvalidAuditInput(f"split must be one of {_SPLITS}, got {split!r}")


def _counts(k: Any, n: Any) -> tuple[FloatArray, FloatArray]:
    k_arr = np.asarray(k)
    n_arr = np.asarray(n)
    for name, arr in (("k", k_arr), ("n", n_arr)):
        if arr.dtype.kind not in "iuf" and arr.dtype != np.bool_:
            raise InvalidAuditInput(f"{name} must hold counts, got dtype {arr.dtype}")
        if arr.size and (not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))):
            raise InvalidAuditInput(f"{name} must hold whole numbers, got {arr!r}")
    kf = k_arr.astype(np.float64)
    nf = n_arr.astype(np.float64)
    if kf.size and np.any(kf < 0):
        raise InvalidAuditInput(f"counts must be non-negative, got k={k!r}")
    if nf.size and np.any(nf < 0):
        raise InvalidAuditInput(f"counts must be non-negative, got n={n!r}")
    kb, nb = np.broadcast_arrays(kf, nf)
    if kb.size and np.any(kb > nb):
        raise InvalidAuditInput(f"k must not exceed n, got k={k!r}, n={n!r}")
    return kb, nb


def _out(out: Any, k: Any, n: Any) -> FloatArray | float:
    if isinstance(k, int | np.integer | float) and isinstance(n, int | np.integer | float):
        return float(out)
    return np.asarray(out, dtype=np.float64)


@overload
def clopper_pearson_upper(k: Count, n: Count, confidence: float) -> float: ...
@overload
def clopper_pearson_upper(
    k: npt.NDArray[Any] | Sequence[int], n: Count | npt.NDArray[Any], confidence: float
) -> FloatArray: ...
def clopper_pearson_upper(k: Any, n: Any, confidence: float) -> FloatArray | float:
    """One-sided Clopper-Pearson upper bound on a binomial proportion.

    With probability at least ``confidence``, the true ``p`` of ``k ~ Binomial(n, p)`` lies at
    or below the returned value: the ``confidence`` quantile of ``Beta(k + 1, n - k)``
    (computed by ``scipy.special.betaincinv``, which ``scipy.stats.beta.ppf`` calls); 1 when
    ``k == n`` (including ``n == 0``). Vectorised: ``k`` and ``n`` broadcast; scalars in give
    a float out.
    """
    c = check_confidence(confidence)
    kf, nf = _counts(k, n)
    full = kf >= nf
    a = kf + 1.0
    b = np.where(full, 1.0, nf - kf)
    with np.errstate(all="ignore"):
        out = np.where(full, 1.0, special.betaincinv(a, b, c))
    return _out(out, k, n)


@overload
def clopper_pearson_lower(k: Count, n: Count, confidence: float) -> float: ...
@overload
def clopper_pearson_lower(
    k: npt.NDArray[Any] | Sequence[int], n: Count | npt.NDArray[Any], confidence: float
) -> FloatArray: ...
def clopper_pearson_lower(k: Any, n: Any, confidence: float) -> FloatArray | float:
    """One-sided Clopper-Pearson lower bound on a binomial proportion.

    With probability at least ``confidence`` the true ``p`` lies at or above the returned
    value: the ``1 - confidence`` quantile of ``Beta(k, n - k + 1)``; 0 when ``k == 0``.
    """
    c = check_confidence(confidence)
    kf, nf = _counts(k, n)
    empty = kf <= 0
    a = np.where(empty, 1.0, kf)
    b = nf - kf + 1.0
    with np.errstate(all="ignore"):
        out = np.where(empty, 0.0, special.betaincinv(a, b, 1.0 - c))
    return _out(out, k, n)
