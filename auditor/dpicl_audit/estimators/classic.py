"""The classical (epsilon, delta) lower bound of an attack (paper 003, Section 2.2).

(epsilon, delta)-DP bounds every test between two neighbours: ``1 - delta - FNR <= e^eps FPR``
and ``1 - delta - FPR <= e^eps FNR``. With one-sided Clopper-Pearson upper bounds on the two
error rates this gives, with the stated joint confidence::

    epsilon_lower = max(log((1 - delta - FNR_u) / FPR_u), log((1 - delta - FPR_u) / FNR_u))

clipped at 0 (a term whose numerator is not positive proves nothing). It is generic (no
Gaussian assumption) and therefore looser than the GDP bound for Gaussian mechanisms.
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import numpy.typing as npt

from dpicl_audit.estimators.stats import (
    ConfidenceSplit,
    Count,
    FloatArray,
    check_delta,
    clopper_pearson_upper,
    per_interval_confidence,
)

__all__ = ["classic_epsilon_from_rates", "epsilon_lower_classic"]


def classic_epsilon_from_rates(fpr_upper: Any, fnr_upper: Any, delta: float) -> FloatArray:
    """The classical bound from given upper bounds on FPR and FNR (vectorised, clipped at 0)."""
    d = check_delta(delta)
    fpr = np.asarray(fpr_upper, dtype=np.float64)
    fnr = np.asarray(fnr_upper, dtype=np.float64)
    with np.errstate(all="ignore"):
        num1 = 1.0 - d - fnr
        num2 = 1.0 - d - fpr
        t1 = np.where((num1 > 0.0) & (fpr > 0.0), np.log(num1) - np.log(fpr), -np.inf)
        t2 = np.where((num2 > 0.0) & (fnr > 0.0), np.log(num2) - np.log(fnr), -np.inf)
        # A zero upper bound cannot come from Clopper-Pearson with n > 0; treat it as infinite.
        t1 = np.where((num1 > 0.0) & (fpr <= 0.0), np.inf, t1)
        t2 = np.where((num2 > 0.0) & (fnr <= 0.0), np.inf, t2)
    return np.asarray(np.maximum(np.maximum(t1, t2), 0.0), dtype=np.float64)


@overload
def epsilon_lower_classic(
    fp: Count,
    n_neg: Count,
    fn: Count,
    n_pos: Count,
    delta: float,
    confidence: float = ...,
    *,
    split: ConfidenceSplit = ...,
) -> float: ...
@overload
def epsilon_lower_classic(
    fp: npt.NDArray[Any],
    n_neg: Count | npt.NDArray[Any],
    fn: npt.NDArray[Any],
    n_pos: Count | npt.NDArray[Any],
    delta: float,
    confidence: float = ...,
    *,
    split: ConfidenceSplit = ...,
) -> FloatArray: ...
def epsilon_lower_classic(
    fp: Count | npt.NDArray[Any],
    n_neg: Count | npt.NDArray[Any],
    fn: Count | npt.NDArray[Any],
    n_pos: Count | npt.NDArray[Any],
    delta: float,
    confidence: float = 0.95,
    *,
    split: ConfidenceSplit = "bonferroni",
) -> FloatArray | float:
    """Classical epsilon lower bound from attack counts (see the module docstring).

    ``fp`` of ``n_neg`` negative (canary-absent) trials were called positive, ``fn`` of
    ``n_pos`` positive trials were missed. ``confidence`` is the joint confidence of the two
    one-sided intervals, shared by ``split`` (default Bonferroni). Vectorised; a float for
    scalar inputs.
    """
    c_each = per_interval_confidence(confidence, 2, split)
    fpr_u = clopper_pearson_upper(np.asarray(fp), np.asarray(n_neg), c_each)
    fnr_u = clopper_pearson_upper(np.asarray(fn), np.asarray(n_pos), c_each)
    out = classic_epsilon_from_rates(fpr_u, fnr_u, delta)
    if all(isinstance(x, int | np.integer) for x in (fp, n_neg, fn, n_pos)):
        return float(out)
    return out
