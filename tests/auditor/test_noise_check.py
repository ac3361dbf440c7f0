"""The noise check (dpicl_audit.estimators.noise_check): chi-square interval for the real
sigma from the debug residuals, its verdicts, and what the bootstrap simulates with.

Statistical tests use seeded generators; each states the chance it would fail on a fresh
draw with a correct implementation (all below 1e-4).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.noise_check import (
    DEFAULT_NOISE_CONFIDENCE,
    check_noise,
    residuals_from_observations,
)


def test_interval_matches_the_chi_square_closed_form() -> None:
    r = np.array([0.5, -1.0, 2.0, 0.25, -0.75])
    ss, n, a = float(np.sum(r**2)), r.size, 0.05
    nc = check_noise(r, 1.0, confidence=0.95)
    assert nc.n_residuals == 5
    assert nc.sigma_hat == pytest.approx(math.sqrt(ss / n))
    assert nc.sigma_lower == pytest.approx(math.sqrt(ss / stats.chi2.ppf(1 - a / 2, n)))
    assert nc.sigma_upper == pytest.approx(math.sqrt(ss / stats.chi2.ppf(a / 2, n)))
    # 5 residuals: the interval [0.57, 2.80] is wider than the measured sigma 1.08
    assert nc.status == "inconclusive" and nc.simulation_sigma == 1.0 and not nc.flagged
    assert nc.message.startswith("INCONCLUSIVE")


def test_an_interval_wider_than_its_own_scale_is_inconclusive_not_consistent() -> None:
    # The same honest noise: 12 residuals cannot confirm sigma (interval ~[0.5, 5] x sigma at
    # the default 1 - 1e-6), 2,000 can (~[0.9, 1.1] x sigma). Deterministic seeds.
    rng = np.random.default_rng(16)
    few = check_noise(3.4 * rng.standard_normal(12), 3.4)
    assert few.status == "inconclusive" and not few.flagged
    assert few.sigma_upper is not None and few.sigma_lower is not None and few.sigma_hat
    assert few.sigma_upper - few.sigma_lower > few.sigma_hat
    many = check_noise(3.4 * rng.standard_normal(2000), 3.4)
    assert many.status == "consistent"
    assert many.sigma_upper is not None and many.sigma_lower is not None and many.sigma_hat
    assert many.sigma_upper - many.sigma_lower <= many.sigma_hat


def test_honest_noise_is_consistent_and_keeps_the_claimed_sigma() -> None:
    # Flagging an honest server has probability <= 1e-6 by construction (two-sided 1e-6).
    rng = np.random.default_rng(11)
    for sigma, n in ((6.85, 20), (0.857, 80), (3.0, 400)):
        nc = check_noise(sigma * rng.standard_normal(n), sigma)
        # 20 residuals give an interval wider than sigma: inconclusive, never flagged
        assert nc.status == ("inconclusive" if n == 20 else "consistent"), nc
        assert nc.simulation_sigma == sigma
        assert nc.sigma_lower is not None and nc.sigma_upper is not None
        assert nc.sigma_lower <= sigma <= nc.sigma_upper


def test_noise_four_times_too_small_is_flagged() -> None:
    # With 48 residuals of sigma/4 the upper bound is below sigma unless the chi-square draw
    # exceeds 48 * (4 / 1.99)^2 ~ 194: probability ~1e-19.
    rng = np.random.default_rng(12)
    sigma = 6.85
    nc = check_noise(sigma / 4 * rng.standard_normal(48), sigma)
    assert nc.status == "smaller" and nc.flagged
    assert nc.sigma_upper is not None and nc.sigma_upper < sigma
    assert nc.simulation_sigma == nc.sigma_upper  # conservative: above the real sigma/4
    assert nc.simulation_sigma > sigma / 4
    assert "NOISE SMALLER THAN CLAIMED" in nc.message
    assert nc.to_dict()["flagged"] is True


def test_noise_larger_than_claimed_is_reported_and_simulated_conservatively() -> None:
    rng = np.random.default_rng(13)
    nc = check_noise(4.0 * rng.standard_normal(100), 1.0)
    assert nc.status == "larger" and not nc.flagged
    assert nc.sigma_upper is not None and nc.simulation_sigma == nc.sigma_upper > 1.0


def test_zero_noise_gives_a_zero_upper_bound() -> None:
    nc = check_noise(np.zeros(10), 2.0)
    assert nc.status == "smaller" and nc.sigma_upper == 0.0 and nc.simulation_sigma == 0.0


def test_no_residuals_leaves_the_claim_unchecked() -> None:
    nc = check_noise([], 2.5)
    assert nc.status == "unchecked" and nc.simulation_sigma == 2.5 and nc.sigma_upper is None


def test_interval_coverage_frequency() -> None:
    # 4,000 intervals at 90%: the number that miss the true sigma is Binomial(4000, 0.1)
    # exactly; the acceptance band is its central 1 - 1e-4 range (false-failure rate 1e-4).
    rng = np.random.default_rng(14)
    reps, n, sigma = 4000, 30, 2.0
    r = sigma * rng.standard_normal((reps, n))
    misses = 0
    for row in r:
        nc = check_noise(row, sigma, confidence=0.9)
        misses += nc.status not in ("consistent", "inconclusive")
    lo, hi = stats.binom.ppf([0.5e-4, 1 - 0.5e-4], reps, 0.1)
    assert lo <= misses <= hi, misses


def test_one_sided_flag_rate_matches_alpha() -> None:
    # At confidence 0.8 an honest server is flagged "smaller" with probability exactly 0.1;
    # band: central 1 - 1e-4 of Binomial(4000, 0.1).
    rng = np.random.default_rng(15)
    reps = 4000
    flagged = sum(
        check_noise(rng.standard_normal(12), 1.0, confidence=0.8).flagged for _ in range(reps)
    )
    lo, hi = stats.binom.ppf([0.5e-4, 1 - 0.5e-4], reps, 0.1)
    assert lo <= flagged <= hi, flagged


def test_residuals_from_debug_observations() -> None:
    obs = [
        {
            "label": "Yes",
            "noisy_votes": {"Yes": 1.5, "No": 2.0},
            "clean_votes": {"Yes": 1, "No": 3},
        },
        {"label": "No"},  # black-box trial: skipped
        {"noisy_votes": {"Yes": -0.5, "No": 4.25}},  # noisy only: skipped
        {"noisy_votes": {"Yes": 0.0, "No": 4.0}, "clean_votes": {"Yes": 0, "No": 4}},
    ]
    r = residuals_from_observations(obs, ["Yes", "No"])
    assert r.tolist() == [0.5, -1.0, 0.0, 0.0]
    with pytest.raises(InvalidAuditInput, match="lacks the label"):
        residuals_from_observations(obs, ["Yes", "No", "Maybe"])


@pytest.mark.parametrize(
    ("residuals", "sigma", "confidence"),
    [([1.0], -1.0, 0.9), ([1.0], math.nan, 0.9), ([1.0], 1.0, 1.0), ([math.inf], 1.0, 0.9)],
)
def test_bad_inputs_are_rejected(residuals: list[float], sigma: float, confidence: float) -> None:
    with pytest.raises(InvalidAuditInput):
        check_noise(residuals, sigma, confidence=confidence)


def test_default_confidence_is_stated() -> None:
    assert DEFAULT_NOISE_CONFIDENCE == 1 - 1e-6
