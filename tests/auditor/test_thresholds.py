"""White-box threshold selection: exactness on small inputs, validity of the split, speed."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import (
    ThresholdEstimate,
    choose_threshold,
    estimate_from_counts,
    split_threshold_estimate,
)


def _brute_force(pos: np.ndarray, neg: np.ndarray, c_each: float) -> float:
    """Best mu lower bound over every threshold (all observed values and -inf), by scipy."""
    best = 0.0
    for tau in np.concatenate([[-np.inf], pos, neg]):
        fp = int(np.sum(neg > tau))
        fn = int(np.sum(pos <= tau))
        fpr_u = 1.0 if fp == neg.size else stats.beta.ppf(c_each, fp + 1, neg.size - fp)
        fnr_u = 1.0 if fn == pos.size else stats.beta.ppf(c_each, fn + 1, pos.size - fn)
        best = max(best, float(stats.norm.ppf(1 - fnr_u) - stats.norm.ppf(fpr_u)))
    return best


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-20, 20), min_size=1, max_size=40),
    st.lists(st.integers(-20, 20), min_size=1, max_size=40),
)
def test_choose_threshold_finds_the_exhaustive_optimum(pos: list[int], neg: list[int]) -> None:
    # integer scores: ties between and within the worlds are exercised
    p, n = np.array(pos, dtype=float), np.array(neg, dtype=float)
    choice = choose_threshold(p, n, confidence=0.95, delta=1e-5)
    # the counts it reports are those of its threshold
    assert choice.fp == int(np.sum(n > choice.threshold))
    assert choice.fn == int(np.sum(p <= choice.threshold))
    assert choice.tp + choice.fn == p.size
    assert choice.objective_value == pytest.approx(_brute_force(p, n, 0.975), abs=1e-9)


def test_choose_threshold_large_input_is_near_the_optimum() -> None:
    # Deterministic (seeded) data. The coarse-to-fine search must land within a hair of the
    # exhaustive optimum over all 30,000 candidate thresholds.
    rng = np.random.default_rng(7)
    pos, neg = rng.normal(1.0, 1.0, 30_000), rng.normal(0.0, 1.0, 30_000)
    choice = choose_threshold(pos, neg, delta=1e-5)
    neg_sorted, pos_sorted = np.sort(neg), np.sort(pos)
    fp = neg.size - np.searchsorted(neg_sorted, neg_sorted, side="right")
    fn = np.searchsorted(pos_sorted, neg_sorted, side="right")
    exhaustive = np.max(
        stats.norm.ppf(1 - stats.beta.ppf(0.975, fn + 1, pos.size - fn))
        - stats.norm.ppf(stats.beta.ppf(0.975, fp + 1, neg.size - fp))
    )
    assert choice.objective_value <= exhaustive + 1e-12
    assert choice.objective_value >= exhaustive - 2e-3


def test_positive_when_below_mirrors_above() -> None:
    rng = np.random.default_rng(3)
    pos, neg = rng.normal(2.0, 1.0, 500), rng.normal(0.0, 1.0, 500)
    above = choose_threshold(pos, neg, delta=1e-5)
    below = choose_threshold(-pos, -neg, delta=1e-5, positive_when="below")
    assert below.threshold == pytest.approx(-above.threshold)
    assert (below.tp, below.fp) == (above.tp, above.fp)
    assert below.tp == int(np.sum(-pos < below.threshold))


def test_split_estimate_counts_and_labels() -> None:
    rng = np.random.default_rng(11)
    pos, neg = rng.normal(1.5, 1.0, 10_000), rng.normal(0.0, 1.0, 8_000)
    est = split_threshold_estimate(pos, neg, rng=rng, fraction=0.25, delta=1e-5)
    assert isinstance(est, ThresholdEstimate)
    assert est.n_select_pos == 2500
    assert est.n_select_neg == 2000
    assert est.tp + est.fn == 7500
    assert est.fp + est.tn == 6000
    # the reported bound is that of the held-out counts
    again = estimate_from_counts(est.tp, est.fn, est.fp, est.tn, delta=1e-5, confidence=0.95)
    assert est.mu_lower == again.mu_lower
    assert est.epsilon_lower == again.epsilon_lower
    assert est.epsilon_lower_classic == again.epsilon_lower_classic
    # the optimistic value is computed on all samples and labelled
    assert est.optimistic.n_pos == 10_000
    data = est.to_dict()
    assert "optimistic" in data["optimistic"]["label"]
    assert data["mu_lower"] == est.mu_lower
    assert 0.5 < est.mu_lower < 1.5


def test_split_estimate_is_valid_at_the_truth() -> None:
    # Validity of the held-out bound: with Gaussian scores of known shift mu = 1 the true
    # trade-off is exactly mu-GDP, so P(mu_lower > 1) <= 5% per repetition whatever threshold
    # the selection part picked. 300 independent repetitions: violations ~ Binomial(300,
    # <= 0.05); failing above binom.ppf(1 - 1e-4) bounds the false-failure rate by 1e-4.
    rng = np.random.default_rng(99)
    reps, n, mu = 300, 600, 1.0
    over = 0
    for _ in range(reps):
        pos, neg = rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)
        est = split_threshold_estimate(pos, neg, rng=rng, delta=1e-5)
        over += est.mu_lower > mu
    assert over <= stats.binom.ppf(1 - 1e-4, reps, 0.05)


def test_tiny_samples_do_not_pick_a_degenerate_threshold() -> None:
    # Deterministic scores (normal quantiles, shift 1, 50 per world). At 1 - 1e-9 the bound is
    # 0 for every threshold; a flat objective would return the first candidate (all but one
    # negative called positive). The fallback ranks by the median bound: a central threshold.
    grid = stats.norm.ppf((np.arange(50) + 0.5) / 50)
    choice = choose_threshold(grid + 1.0, grid, delta=1e-5, confidence=1 - 1e-9)
    assert choice.objective_value == 0.0
    assert 10 <= choice.fp <= 40
    assert 10 <= choice.fn <= 40
    assert 0.0 < choice.threshold < 1.0


def test_threshold_validation() -> None:
    rng = np.random.default_rng(0)
    good = np.zeros(10)
    with pytest.raises(InvalidAuditInput, match="scores_pos"):
        choose_threshold(np.array([1.0, np.nan]), good, delta=1e-5)
    with pytest.raises(InvalidAuditInput, match="empty"):
        choose_threshold(np.array([]), good, delta=1e-5)
    with pytest.raises(InvalidAuditInput, match="one-dimensional"):
        choose_threshold(np.zeros((2, 2)), good, delta=1e-5)
    with pytest.raises(InvalidAuditInput, match="fraction"):
        split_threshold_estimate(good, good, rng=rng, fraction=1.0, delta=1e-5)
    with pytest.raises(InvalidAuditInput, match="fraction"):
        split_threshold_estimate(good[:1], good, rng=rng, delta=1e-5)
    with pytest.raises(InvalidAuditInput, match="positive_when"):
        choose_threshold(good, good, delta=1e-5, positive_when="left")  # type: ignore[arg-type]


def test_threshold_speed_smoke() -> None:
    # Smoke check, not a benchmark: 400,000 scores (200,000 per world) well under a second on
    # an idle machine; the limit leaves room for a loaded CI runner.
    rng = np.random.default_rng(1)
    pos, neg = rng.normal(0.3, 1.0, 200_000), rng.normal(0.0, 1.0, 200_000)
    choose_threshold(pos[:1000], neg[:1000], delta=1e-5)  # warm-up
    start = time.perf_counter()
    choose_threshold(pos, neg, delta=1e-5)
    assert time.perf_counter() - start < 2.0
