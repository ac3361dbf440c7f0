"""Renyi DP of noisy argmax (paper 003): exact divergence and the 2-cut lower bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, special, stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import (
    noisy_argmax_log_probabilities,
    rdp_to_epsilon,
    rdp_two_cut_lower,
    renyi_noisy_argmax_exact,
)
from dpicl_audit.mechanisms.voting.bootstrap import simulate_voting

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0])


def _bernoulli_renyi(p: float, q: float, alpha: float) -> float:
    return math.log(p**alpha * q ** (1 - alpha) + (1 - p) ** alpha * (1 - q) ** (1 - alpha)) / (
        alpha - 1
    )


@pytest.mark.parametrize(("counts", "sigma"), [([1, 9], 2.0), ([4, 4], 1.0), ([0, 100], 1.0)])
def test_two_class_release_probabilities_are_closed_form(counts: list[int], sigma: float) -> None:
    # With two classes, argmax = 0 iff N(0, 2 sigma^2) > n1 - n0.
    got = noisy_argmax_log_probabilities(counts, sigma)
    z = (counts[0] - counts[1]) / (sigma * math.sqrt(2))
    assert got[0] == pytest.approx(float(special.log_ndtr(z)), rel=1e-8, abs=1e-12)
    assert got[1] == pytest.approx(float(special.log_ndtr(-z)), rel=1e-8, abs=1e-12)


def test_three_class_release_probabilities() -> None:
    counts, sigma = np.array([3.0, 5.0, 2.0]), 1.5
    got = np.exp(noisy_argmax_log_probabilities(counts, sigma))
    for c in range(3):
        others = np.delete(counts, c)

        def f(x: float, c: int = c, others: np.ndarray = others) -> float:
            return float(
                stats.norm.pdf(x, counts[c], sigma) * np.prod(stats.norm.cdf(x, others, sigma))
            )

        ref = integrate.quad(f, -20, 30, limit=200, epsabs=0, epsrel=1e-10)[0]
        assert got[c] == pytest.approx(ref, rel=1e-7)
    assert got.sum() == pytest.approx(1.0, rel=1e-12)


def test_release_probabilities_match_simulation() -> None:
    # 300,000 noisy argmaxes of [3, 5, 2, 5] (a tie in the clean counts): chi-square
    # goodness of fit at 1e-4, false-failure rate 1e-4.
    rng = np.random.default_rng(8)
    counts, sigma, n = np.array([3.0, 5.0, 2.0, 5.0]), 1.2, 300_000
    labels = np.argmax(counts + sigma * rng.standard_normal((n, 4)), axis=1)
    observed = np.bincount(labels, minlength=4)
    expected = n * np.exp(noisy_argmax_log_probabilities(counts, sigma))
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_exact_renyi_two_classes_is_bernoulli_divergence() -> None:
    a, b, sigma = [1, 9], [0, 10], 2.0
    p = stats.norm.cdf(-8 / (sigma * math.sqrt(2)))
    q = stats.norm.cdf(-10 / (sigma * math.sqrt(2)))
    got = renyi_noisy_argmax_exact(a, b, sigma, ORDERS)
    ref = [_bernoulli_renyi(p, q, alpha) for alpha in ORDERS]
    np.testing.assert_allclose(got, ref, rtol=1e-7)
    kl = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    assert renyi_noisy_argmax_exact(a, b, sigma, 1.0) == pytest.approx(kl, rel=1e-7)
    assert isinstance(renyi_noisy_argmax_exact(a, b, sigma, 2.0), float)


@pytest.mark.parametrize(
    ("a", "b", "sigma"),
    [([1, 9], [0, 10], 1.0), ([3, 5, 2], [2, 5, 3], 1.5), ([10, 0, 0, 0], [9, 1, 0, 0], 0.7)],
)
def test_exact_renyi_obeys_post_processing_and_monotonicity(
    a: list[int], b: list[int], sigma: float
) -> None:
    got = renyi_noisy_argmax_exact(a, b, sigma, ORDERS)
    # data processing: the argmax leaks no more than the Gaussian histogram itself,
    # D_alpha = alpha ||a - b||^2 / (2 sigma^2)
    gaussian = ORDERS * float(np.sum((np.array(a) - np.array(b)) ** 2)) / (2 * sigma**2)
    assert np.all(got <= gaussian * (1 + 1e-9))
    assert np.all(np.diff(got) >= -1e-12)  # Renyi divergence grows with the order
    assert renyi_noisy_argmax_exact(a, a, sigma, 2.0) == pytest.approx(0.0, abs=1e-9)


def _two_cut_reference(tp: int, fn: int, fp: int, tn: int, alpha: float, c: float) -> float:
    c_each = 1 - (1 - c) / 4
    n1, n2 = tp + fn, fp + tn

    def lower(k: int, n: int) -> float:
        return 0.0 if k == 0 else float(stats.beta.ppf(1 - c_each, k, n - k + 1))

    def upper(k: int, n: int) -> float:
        return 1.0 if k == n else float(stats.beta.ppf(c_each, k + 1, n - k))

    p1l, p1u, p2l, p2u = lower(tp, n1), upper(tp, n1), lower(fp, n2), upper(fp, n2)

    def bound(ql: float, qu: float, rl: float, ru: float) -> float:
        s = ql**alpha * ru ** (1 - alpha) + (1 - qu) ** alpha * (1 - rl) ** (1 - alpha)
        return math.log(s) / (alpha - 1) if s > 0 else 0.0

    return max(0.0, bound(p1l, p1u, p2l, p2u), bound(p2l, p2u, p1l, p1u))


@pytest.mark.parametrize(
    ("tp", "fn", "fp", "tn"), [(900, 100, 100, 900), (496, 199504, 28, 199972)]
)
def test_two_cut_lower_formula(tp: int, fn: int, fp: int, tn: int) -> None:
    for alpha in (1.5, 2.0, 8.0):
        got = rdp_two_cut_lower(tp, fn, fp, tn, alpha, confidence=0.95)
        assert got == pytest.approx(_two_cut_reference(tp, fn, fp, tn, alpha, 0.95), rel=1e-9)
    single = rdp_two_cut_lower(tp, fn, fp, tn, ORDERS)
    np.testing.assert_allclose(rdp_two_cut_lower(tp, fn, fp, tn, ORDERS, queries=5), 5 * single)
    assert rdp_two_cut_lower(50, 50, 50, 50, 2.0) == 0.0


def test_two_cut_audit_is_below_the_exact_divergence() -> None:
    # A noisy-argmax audit of [1, 9] vs [0, 10] at sigma = 2 (O = "label 0 released"),
    # 200,000 trials per world. The 2-cut bound at confidence 1 - 1e-4 exceeds the exact
    # divergence with probability <= 1e-4 (the false-failure rate). It should also be
    # informative: in 3,000 simulated repetitions (binomial counts) the smallest ratio to the
    # exact value over all orders was 0.039 (mean 0.11 at order 1.5, 0.65 at 32); the 0.02
    # floor was never reached.
    a, b, sigma, n = [1, 9], [0, 10], 2.0, 200_000
    exact = np.maximum(
        renyi_noisy_argmax_exact(a, b, sigma, ORDERS), renyi_noisy_argmax_exact(b, a, sigma, ORDERS)
    )
    sim = simulate_voting(
        [a], [b], sigma, n, positive_index=0, negative_index=1, rng=np.random.default_rng(21)
    )
    tp, fp = int(sim.decisions_with.sum()), int(sim.decisions_without.sum())
    lower = rdp_two_cut_lower(tp, n - tp, fp, n - fp, ORDERS, confidence=1 - 1e-4)
    assert np.all(lower <= exact)
    assert np.all(lower >= 0.02 * exact)


def test_rdp_to_epsilon_matches_dp_accounting() -> None:
    sigma, delta = 2.0, 1e-5
    rdp = ORDERS / (2 * sigma**2)  # Gaussian mechanism, sensitivity 1
    expected, _ = rdp_privacy_accountant.compute_epsilon(list(ORDERS), list(rdp), delta)
    assert rdp_to_epsilon(ORDERS, rdp, delta) == pytest.approx(expected, rel=1e-12)


def test_rdp_validation() -> None:
    with pytest.raises(InvalidAuditInput):
        renyi_noisy_argmax_exact([1, 2], [1, 2, 3], 1.0, 2.0)
    with pytest.raises(InvalidAuditInput):
        renyi_noisy_argmax_exact([1, 2], [2, 1], 0.0, 2.0)
    with pytest.raises(InvalidAuditInput):
        renyi_noisy_argmax_exact([1, 2], [2, 1], 1.0, 0.5)
    with pytest.raises(InvalidAuditInput):
        rdp_two_cut_lower(1, 1, 1, 1, 1.0)
    with pytest.raises(InvalidAuditInput):
        rdp_two_cut_lower(-1, 1, 1, 1, 2.0)
    with pytest.raises(InvalidAuditInput):
        rdp_to_epsilon([2.0, 3.0], [0.1], 1e-5)
