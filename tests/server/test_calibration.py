"""Noise calibration and the Gaussian privacy curve (dpicl.privacy.calibration).

Reference values come from closed forms (paper 000, Algorithm 2 line 7; the GDP curve of
Section 2), from direct quadrature of the hockey-stick divergence, and from dp-accounting's
PLD accountant. Nothing here is random except hypothesis, which runs derandomized.
"""

from __future__ import annotations

import itertools
import math

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import norm

from dpicl.errors import ConfigurationError
from dpicl.mechanisms.voting.release import VOTING_SENSITIVITY
from dpicl.privacy.calibration import (
    analytic_sigma,
    classic_sigma,
    epsilon_exact,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu,
    sigma_for,
    validate_privacy_params,
)

CASES = [
    (0.1, 1e-5),
    (0.5, 1e-6),
    (1.0, 1e-5),
    (2.0, 1e-3),
    (4.0, 1e-8),
    (8.0, 1e-5),
]


@pytest.mark.parametrize(("epsilon", "delta"), CASES)
def test_classic_sigma_is_algorithm_2_line_7(epsilon: float, delta: float) -> None:
    paper = 2.0 * math.sqrt(math.log(1.25 / delta)) / epsilon
    assert math.sqrt(2.0) == VOTING_SENSITIVITY
    assert classic_sigma(epsilon, delta, VOTING_SENSITIVITY) == pytest.approx(paper, rel=1e-12)
    # In this range the formula delivers its promise, so sigma_for keeps it unchanged.
    assert sigma_for(epsilon, delta, VOTING_SENSITIVITY, "classic") == pytest.approx(
        paper, rel=1e-12
    )


def test_classic_sigma_general_sensitivity() -> None:
    # Dwork-Roth Theorem A.1: sigma = Delta2 sqrt(2 ln(1.25/delta)) / epsilon.
    assert classic_sigma(0.5, 1e-4, 3.0) == pytest.approx(
        3.0 * math.sqrt(2.0 * math.log(12500.0)) / 0.5, rel=1e-12
    )


@pytest.mark.parametrize(("epsilon", "delta"), CASES)
@pytest.mark.parametrize("sensitivity", [VOTING_SENSITIVITY, 0.2, 1.0])
def test_analytic_sigma_is_exact_and_below_classic(
    epsilon: float, delta: float, sensitivity: float
) -> None:
    a = analytic_sigma(epsilon, delta, sensitivity)
    assert a < classic_sigma(epsilon, delta, sensitivity)
    assert sigma_for(epsilon, delta, sensitivity, "analytic") == a
    # Tight: the curve passes through (epsilon, delta) exactly, and never above it.
    achieved = gaussian_delta(epsilon, sensitivity / a)
    assert achieved == pytest.approx(delta, rel=1e-9)
    assert achieved <= delta


def test_classic_formula_overshoots_at_large_epsilon_and_sigma_for_guards_it() -> None:
    epsilon, delta = 16.0, 1e-5
    raw = classic_sigma(epsilon, delta, VOTING_SENSITIVITY)
    # The raw formula (proved only for epsilon < 1) really delivers a worse epsilon here.
    assert gaussian_epsilon(delta, VOTING_SENSITIVITY / raw) > 1.1 * epsilon
    guarded = sigma_for(epsilon, delta, VOTING_SENSITIVITY, "classic")
    assert guarded == analytic_sigma(epsilon, delta, VOTING_SENSITIVITY)
    assert epsilon_exact(guarded, VOTING_SENSITIVITY, delta) <= epsilon * (1 + 1e-3)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(
    epsilon=st.floats(min_value=0.01, max_value=30.0),
    log10_delta=st.floats(min_value=-12.0, max_value=-2.0),
    sensitivity=st.floats(min_value=0.01, max_value=10.0),
    calibration=st.sampled_from(["classic", "analytic"]),
)
def test_calibration_never_overshoots_epsilon(
    epsilon: float, log10_delta: float, sensitivity: float, calibration: str
) -> None:
    delta = 10.0**log10_delta
    sigma = sigma_for(epsilon, delta, sensitivity, calibration)  # type: ignore[arg-type]
    assert epsilon_exact(sigma, sensitivity, delta) <= epsilon * (1 + 1e-3)
    assert gaussian_delta(epsilon, sensitivity / sigma) <= delta


@pytest.mark.parametrize("mu", [0.05, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("epsilon", [0.0, 0.2, 1.0, 3.0])
def test_gaussian_delta_matches_hockey_stick_quadrature(mu: float, epsilon: float) -> None:
    # delta(eps) = int max(0, p1(x) - e^eps p0(x)) dx for p1 = N(mu, 1), p0 = N(0, 1): an
    # independent definition of the same quantity.
    def gap(x: float) -> float:
        return max(0.0, float(norm.pdf(x, loc=mu)) - math.exp(epsilon) * float(norm.pdf(x)))

    cut = epsilon / mu + mu / 2  # the privacy loss exceeds epsilon exactly for x > cut
    reference, _ = integrate.quad(gap, cut, cut + 40, epsabs=1e-15, epsrel=1e-12, limit=200)
    assert gaussian_delta(epsilon, mu) == pytest.approx(reference, rel=1e-8, abs=1e-15)


def test_gaussian_delta_edges_and_monotonicity() -> None:
    assert gaussian_delta(1.0, 0.0) == 0.0
    assert gaussian_delta(0.0, 1.0) == pytest.approx(2 * norm.cdf(0.5) - 1, rel=1e-12)
    values = [gaussian_delta(e, 1.0) for e in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)]
    assert all(a > b for a, b in itertools.pairwise(values))
    values = [gaussian_delta(1.0, m) for m in (0.1, 0.5, 1.0, 2.0, 4.0)]
    assert all(a < b for a, b in itertools.pairwise(values))
    # Deep tails keep relative accuracy (no cancellation to 0 or negatives).
    tiny = gaussian_delta(10.0, 0.5)
    assert 0.0 < tiny < 1e-50
    with pytest.raises(ValueError, match="epsilon"):
        gaussian_delta(-1.0, 1.0)


@pytest.mark.parametrize("mu", [0.01, 0.2, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_gaussian_epsilon_agrees_with_pld(mu: float, delta: float) -> None:
    exact = gaussian_epsilon(delta, mu)
    assert gaussian_delta(exact, mu) <= delta
    if exact > 0:
        assert gaussian_delta(exact, mu) == pytest.approx(delta, rel=1e-9)
    pld = epsilon_exact(1.0 / mu, 1.0, delta)
    # PLD is a pessimistic estimate: never below the truth, and within 1e-3 (in fact ~1e-6).
    assert pld >= exact * (1 - 1e-12)
    assert pld == pytest.approx(exact, rel=1e-3, abs=1e-9)


def test_gaussian_epsilon_is_zero_when_delta_covers_everything() -> None:
    # delta(0; mu) = 2 Phi(mu/2) - 1 <= delta means epsilon = 0 suffices.
    assert gaussian_epsilon(0.5, 0.1) == 0.0


@pytest.mark.parametrize("k", [2, 5, 10])
def test_composition_is_gaussian_with_mu_sqrt_k(k: int) -> None:
    # Dong, Roth and Su 2019, Corollary 3.3: k compositions of mu-GDP are (mu sqrt k)-GDP.
    sigma, sens, delta = 3.0, VOTING_SENSITIVITY, 1e-5
    mu = sens / sigma
    closed = gaussian_epsilon(delta, mu * math.sqrt(k))
    # dp-accounting composing k separate PLDs (real convolutions, not the sqrt(k) shortcut).
    accountant = PLDAccountant(value_discretization_interval=1e-3)
    for _ in range(k):
        accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma / sens))
    convolved = float(accountant.get_epsilon(delta))
    assert convolved == pytest.approx(closed, rel=1e-3)
    assert convolved >= closed * (1 - 1e-9)
    assert epsilon_exact(sigma, sens, delta, count=k) == pytest.approx(closed, rel=1e-3)


@pytest.mark.parametrize(("epsilon", "delta"), CASES)
def test_gaussian_mu_inverts_gaussian_epsilon(epsilon: float, delta: float) -> None:
    mu = gaussian_mu(epsilon, delta)
    assert gaussian_delta(epsilon, mu) <= delta
    assert gaussian_epsilon(delta, mu) == pytest.approx(epsilon, rel=1e-9)
    assert gaussian_mu(gaussian_epsilon(delta, mu), delta) == pytest.approx(mu, rel=1e-9)


@pytest.mark.parametrize(
    ("epsilon", "delta", "param", "shown"),
    [
        (0.0, 1e-5, "mechanism.epsilon", "0.0"),
        (-1.0, 1e-5, "mechanism.epsilon", "-1.0"),
        (math.nan, 1e-5, "mechanism.epsilon", "nan"),
        (math.inf, 1e-5, "mechanism.epsilon", "inf"),
        (1.0, 0.0, "mechanism.delta", "0.0"),
        (1.0, 1.0, "mechanism.delta", "1.0"),
        (1.0, -0.5, "mechanism.delta", "-0.5"),
        (1.0, math.nan, "mechanism.delta", "nan"),
    ],
)
def test_validate_privacy_params_names_the_bad_value(
    epsilon: float, delta: float, param: str, shown: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_privacy_params(epsilon, delta)
    assert info.value.param == param
    assert shown in info.value.message
    with pytest.raises(ConfigurationError):
        sigma_for(epsilon, delta, VOTING_SENSITIVITY, "analytic")


def test_validate_privacy_params_prefix() -> None:
    validate_privacy_params(1.0, 1e-5)
    with pytest.raises(ConfigurationError) as info:
        validate_privacy_params(-2.0, 1e-5, param_prefix="budget")
    assert info.value.param == "budget.epsilon"
    with pytest.raises(ConfigurationError) as info:
        validate_privacy_params(1.0, 2.0, param_prefix="")
    assert info.value.param == "delta"


def test_sigma_for_rejects_unknown_calibration() -> None:
    with pytest.raises(ConfigurationError) as info:
        sigma_for(1.0, 1e-5, VOTING_SENSITIVITY, "magic")  # type: ignore[arg-type]
    assert info.value.param == "mechanism.calibration"
    assert "magic" in info.value.message


def test_epsilon_exact_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="sigma"):
        epsilon_exact(0.0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="count"):
        epsilon_exact(1.0, 1.0, 1e-5, count=0)
    with pytest.raises(ValueError, match="delta"):
        epsilon_exact(1.0, 1.0, 1.5)
