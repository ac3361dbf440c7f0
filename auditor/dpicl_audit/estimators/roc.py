"""ROC, AUROC and TPR at low FPR of an audit's attack (issue 27), as membership-inference
tools report them (ML Privacy Meter, jax_privacy), beside the GDP and classical bounds.

These are *descriptive* figures of the attack on the logged trials (no confidence interval,
no threshold selection): the bounds remain the audit's claims. For a white-box score the
curve is the empirical ROC over every threshold (positive above it); for a black-box
decision it is the single operating point joined to (0, 0) and (1, 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from dpicl_audit.jsontypes import JsonObject

__all__ = ["LOW_FPRS", "roc_from_decisions", "roc_from_scores"]

#: The false-positive rates at which the TPR is reported.
LOW_FPRS = (0.1, 0.01, 0.001)
_MAX_POINTS = 101


def roc_from_scores(pos: npt.ArrayLike, neg: npt.ArrayLike) -> JsonObject | None:
    """AUROC (the Mann-Whitney probability that a trial with the canary scores above one
    without, ties counting half), TPR at each of :data:`LOW_FPRS` (the largest TPR of a
    threshold whose empirical FPR is at most it) and the curve (at most 101 points)."""
    p = np.asarray(pos, dtype=np.float64).ravel()
    n = np.asarray(neg, dtype=np.float64).ravel()
    if p.size == 0 or n.size == 0:
        return None
    thresholds = np.unique(np.concatenate([p, n]))[::-1]
    ps, ns = np.sort(p), np.sort(n)
    # positive when score >= t: counts of each world at or above every threshold
    tpr = (p.size - np.searchsorted(ps, thresholds, side="left")) / p.size
    fpr = (n.size - np.searchsorted(ns, thresholds, side="left")) / n.size
    tpr = np.concatenate([[0.0], tpr])
    fpr = np.concatenate([[0.0], fpr])
    auroc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))
    return _summary(auroc, fpr, tpr)


def roc_from_decisions(tp: int, fn: int, fp: int, tn: int) -> JsonObject | None:
    """The same figures for a binary decision: one operating point."""
    if tp + fn == 0 or fp + tn == 0:
        return None
    t, f = tp / (tp + fn), fp / (fp + tn)
    fpr, tpr = np.array([0.0, f, 1.0]), np.array([0.0, t, 1.0])
    return _summary((1.0 + t - f) / 2.0, fpr, tpr)


def _summary(auroc: float, fpr: np.ndarray, tpr: np.ndarray) -> dict[str, Any]:
    at = {}
    for x in LOW_FPRS:
        ok = fpr <= x + 1e-12
        at[f"{x:g}"] = float(np.max(tpr[ok])) if np.any(ok) else 0.0
    idx = np.unique(np.linspace(0, fpr.size - 1, min(fpr.size, _MAX_POINTS)).astype(int))
    return {
        "auroc": auroc,
        "tpr_at_fpr": at,
        "curve": [[float(fpr[i]), float(tpr[i])] for i in idx],
    }
