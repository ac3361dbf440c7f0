"""One ROC curve for both descriptive figures (issue 35, item 9): the AUROC is its area and
the TPR at a low FPR its height, checked against independent computations; and the GDP
estimator clips mu at 0 (an attack worse than chance certifies nothing), where jax_privacy's
estimator over-reports."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpicl_audit.estimators.counts import estimate_from_counts
from dpicl_audit.estimators.gdp import mu_from_rates, mu_lower
from dpicl_audit.estimators.roc import ROC_DEFINITION, roc_from_decisions, roc_from_scores


def _curve_height(pos: np.ndarray, neg: np.ndarray, x: float) -> float:
    """Independently: the ROC's points from a loop over the thresholds, then the straight
    line between the last point at FPR <= x and the first beyond it."""
    pts = [(0.0, 0.0)]
    for t in sorted(set(pos) | set(neg), reverse=True):
        pts.append((float(np.mean(neg >= t)), float(np.mean(pos >= t))))
    below = [p for p in pts if p[0] <= x]
    above = [p for p in pts if p[0] > x]
    f0, t0 = max(below)  # the top of the last vertical run at or below x
    if not above:
        return t0
    f1, t1 = min(above)
    return t0 + (t1 - t0) * (x - f0) / (f1 - f0)


def test_auroc_and_tpr_read_the_same_curve_on_tied_scores() -> None:
    # Integer scores: many ties, where reading only the observed thresholds differs from the
    # curve (deterministic data: no chance in this test).
    rng = np.random.default_rng(35)
    pos = rng.integers(0, 6, 400).astype(float) + 1.0
    neg = rng.integers(0, 6, 600).astype(float)
    roc = roc_from_scores(pos, neg)
    assert roc is not None
    # AUROC: the Mann-Whitney probability, ties counting half (scipy's U statistic)
    u = stats.mannwhitneyu(pos, neg, alternative="two-sided").statistic
    assert roc["auroc"] == pytest.approx(u / (pos.size * neg.size), abs=1e-12)
    for x in (0.1, 0.01, 0.001):
        assert roc["tpr_at_fpr"][f"{x:g}"] == pytest.approx(_curve_height(pos, neg, x), abs=1e-12)
    # The AUROC is the area under the very points the TPR is read from.
    f, t = np.array(roc["curve"]).T
    assert roc["auroc"] == pytest.approx(np.trapezoid(t, f), abs=1e-12)
    assert "straight lines" in ROC_DEFINITION


def test_a_decision_s_tpr_at_low_fpr_is_on_its_line() -> None:
    # One operating point (FPR 0.2, TPR 0.6): below FPR 0.2 the curve is the line from (0, 0),
    # the randomised rule that answers "present" with probability x / 0.2.
    roc = roc_from_decisions(tp=60, fn=40, fp=20, tn=80)
    assert roc is not None
    assert roc["auroc"] == pytest.approx((1 + 0.6 - 0.2) / 2)
    assert roc["tpr_at_fpr"]["0.1"] == pytest.approx(0.3)
    assert roc["tpr_at_fpr"]["0.01"] == pytest.approx(0.03)
    assert roc["tpr_at_fpr"]["0.001"] == pytest.approx(0.003)
    # At or beyond the point: its TPR, then the line to (1, 1).
    assert roc_from_decisions(80, 20, 10, 90)["tpr_at_fpr"]["0.1"] == pytest.approx(0.8)  # type: ignore[index]


def test_untied_scores_read_as_the_observed_thresholds() -> None:
    # Continuous scores (no ties): each segment of the curve is flat or vertical, so its height
    # at x is the largest TPR of an observed threshold with FPR <= x (the former reading).
    rng = np.random.default_rng(9)
    pos, neg = rng.normal(1.0, 1.0, 500), rng.normal(0.0, 1.0, 500)
    roc = roc_from_scores(pos, neg)
    assert roc is not None
    for x in (0.1, 0.01, 0.001):
        observed = max(
            [float(np.mean(pos >= t)) for t in np.concatenate([pos, neg]) if np.mean(neg >= t) <= x]
            + [0.0]
        )
        assert roc["tpr_at_fpr"][f"{x:g}"] == pytest.approx(observed, abs=1e-12)


def test_the_gdp_estimator_clips_mu_at_zero() -> None:
    # An attack worse than chance (it says "present" more often without the canary): the raw
    # Phi^-1(1 - FNR_u) - Phi^-1(FPR_u) is negative; the bound is 0 and so is its epsilon.
    # (jax_privacy 2.0.0's GDP estimator turns such a negative mu into a positive epsilon.)
    raw = stats.norm.ppf(1 - stats.beta.ppf(0.975, 701, 300)) - stats.norm.ppf(
        stats.beta.ppf(0.975, 701, 300)
    )
    assert raw < -1.0
    assert mu_lower(700, 1000, 700, 1000, 0.95) == 0.0
    est = estimate_from_counts(300, 700, 700, 300, delta=1e-5, confidence=0.95)
    assert est.mu_lower == 0.0 and est.epsilon_lower == 0.0
    # the vectorised form too, and the degenerate rates (1, 1) whose difference is NaN
    got = mu_from_rates(np.array([0.9, 1.0, 0.05]), np.array([0.9, 1.0, 0.05]))
    assert got[0] == 0.0 and got[1] == 0.0 and got[2] > 3.0
