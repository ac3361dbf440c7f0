"""ROC, AUROC and TPR at low FPR of an audit's attack (issue 27), as membership-inference
tools report them (ML Privacy Meter, jax_privacy), beside the GDP and classical bounds.

These are *descriptive* figures of the attack on the logged trials (no confidence interval,
no threshold selection): the bounds remain the audit's claims.

**One curve** (:data:`ROC_DEFINITION`, issue 35, item 9): the empirical ROC, the (FPR, TPR)
of every observed threshold (positive at or above it; for a black-box decision its single
operating point), from (0, 0) to (1, 1), consecutive points joined by straight lines. A
point on a line is the attack that randomises between the line's two thresholds, so every
point of the curve is an attack one can run. Both figures read this curve: the AUROC is the
area under it (which equals the Mann-Whitney probability, ties counting half), and the TPR at
an FPR is its height there. (Before, the TPR read only the observed thresholds: the same
number for untied scores, where a line between consecutive thresholds is flat or vertical,
but 0 for a decision whose one operating point lies above the FPR asked.)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpicl_audit.jsontypes import JsonObject

__all__ = ["LOW_FPRS", "ROC_DEFINITION", "roc_from_decisions", "roc_from_scores", "tpr_at"]

#: The name of the one ROC curve that the AUROC and the TPR at low FPR both read.
ROC_DEFINITION = "empirical ROC, observed thresholds joined by straight lines (randomised)"

#: The false-positive rates at which the TPR is reported.
LOW_FPRS = (0.1, 0.01, 0.001)
_MAX_POINTS = 101


def roc_from_scores(pos: npt.ArrayLike, neg: npt.ArrayLike) -> JsonObject | None:
    """AUROC (the area under the curve of :data:`ROC_DEFINITION`: the Mann-Whitney probability
    that a trial with the canary scores above one without, ties counting half), the TPR at
    each of :data:`LOW_FPRS` (the curve's height there) and the curve (at most 101 points)."""
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
    return _summary(fpr, tpr)


def roc_from_decisions(tp: int, fn: int, fp: int, tn: int) -> JsonObject | None:
    """The same figures for a binary decision: one operating point."""
    if tp + fn == 0 or fp + tn == 0:
        return None
    t, f = tp / (tp + fn), fp / (fp + tn)
    fpr, tpr = np.array([0.0, f, 1.0]), np.array([0.0, t, 1.0])
    return _summary(fpr, tpr)  # its AUROC: (1 + t - f) / 2


def tpr_at(fpr: np.ndarray, tpr: np.ndarray, x: float) -> float:
    """The height at FPR ``x`` of the curve through the points (``fpr``, ``tpr``), both
    non-decreasing from (0, 0) to (1, 1) (:data:`ROC_DEFINITION`): on a vertical run of
    points its top, between two points the straight line."""
    i = int(np.searchsorted(fpr, x + 1e-12, side="right")) - 1  # the last point at FPR <= x
    if i < 0:
        return 0.0
    if i == fpr.size - 1 or fpr[i] >= x:
        return float(tpr[i])
    w = (x - fpr[i]) / (fpr[i + 1] - fpr[i])
    return float(tpr[i] + w * (tpr[i + 1] - tpr[i]))


def _summary(fpr: np.ndarray, tpr: np.ndarray) -> JsonObject:
    """Both figures from the one curve: its area (trapezoids between the points) and its
    height at each low FPR."""
    auroc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))
    at: JsonObject = {f"{x:g}": tpr_at(fpr, tpr, x) for x in LOW_FPRS}
    idx = np.unique(np.linspace(0, fpr.size - 1, min(fpr.size, _MAX_POINTS)).astype(int))
    return {
        "auroc": auroc,
        "tpr_at_fpr": at,
        "curve": [[float(fpr[i]), float(tpr[i])] for i in idx],
    }
