"""Budget accounting in mu^2 units (dpicl.privacy.accounting). Deterministic."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant
from hypothesis import given, settings
from hypothesis import strategies as st

from dpicl.errors import ConfigurationError
from dpicl.mechanisms.voting.release import VOTING_SENSITIVITY
from dpicl.privacy.accounting import (
    MU2_RTOL,
    budget_mu2,
    fits,
    gaussian_mu2,
    mu2_limit,
    remaining_queries,
    spent_epsilon,
    spent_epsilon_pld,
)
from dpicl.privacy.calibration import (
    gaussian_delta,
    gaussian_epsilon,
    sigma_for,
)


def test_gaussian_mu2() -> None:
    assert gaussian_mu2(2.0, VOTING_SENSITIVITY) == pytest.approx(0.5, rel=1e-15)
    assert gaussian_mu2(0.5, 1.0) == 4.0
    with pytest.raises(ValueError, match="sigma"):
        gaussian_mu2(0.0, 1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        gaussian_mu2(1.0, -1.0)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 1e-6), (1.0, 1e-5), (8.0, 1e-5)])
def test_budget_mu2_is_the_exact_frontier(epsilon: float, delta: float) -> None:
    m2 = budget_mu2(epsilon, delta)
    assert gaussian_delta(epsilon, math.sqrt(m2)) <= delta
    assert gaussian_delta(epsilon, math.sqrt(m2)) == pytest.approx(delta, rel=1e-9)
    spent = spent_epsilon(m2, delta)
    assert spent <= epsilon
    assert spent == pytest.approx(epsilon, rel=1e-9)


def test_budget_mu2_validates() -> None:
    with pytest.raises(ConfigurationError) as info:
        budget_mu2(0.0, 1e-5)
    assert info.value.param == "budget.epsilon"
    with pytest.raises(ConfigurationError) as info:
        budget_mu2(1.0, 0.0)
    assert info.value.param == "budget.delta"


def test_spent_epsilon_zero_and_pld_cross_check() -> None:
    assert spent_epsilon(0.0, 1e-5) == 0.0
    assert spent_epsilon_pld(0.0, 1e-5) == 0.0
    for m2 in (1e-4, 0.05, 0.7, 4.0, 30.0):
        exact = spent_epsilon(m2, 1e-5)
        pld = spent_epsilon_pld(m2, 1e-5)
        assert pld >= exact * (1 - 1e-12)
        assert pld == pytest.approx(exact, rel=1e-3)
    with pytest.raises(ValueError, match="mu2_spent"):
        spent_epsilon(-1.0, 1e-5)


def test_heterogeneous_composition_matches_pld() -> None:
    # Corollary 3.3 of Dong, Roth and Su: mu = sqrt(sum mu_i^2), for different sigmas too.
    sigmas = [2.0, 3.5, 5.0, 1.7]
    delta = 1e-6
    accountant = PLDAccountant(value_discretization_interval=1e-3)
    for s in sigmas:
        accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=s / VOTING_SENSITIVITY))
    total = sum(gaussian_mu2(s, VOTING_SENSITIVITY) for s in sigmas)
    assert float(accountant.get_epsilon(delta)) == pytest.approx(
        spent_epsilon(total, delta), rel=1e-3
    )


@pytest.mark.parametrize("k", [1, 2, 3, 7, 10, 49, 100])
def test_k_queries_designed_to_fit_do_fit(k: int) -> None:
    # A provider sets the budget to what k answers of the context's sigma cost, through the
    # closed form, exactly as a user would; all k must fit and the (k+1)-th must not.
    delta = 1e-5
    sigma = sigma_for(1.0, delta, VOTING_SENSITIVITY, "analytic")
    mu2 = gaussian_mu2(sigma, VOTING_SENSITIVITY)
    budget_eps = gaussian_epsilon(delta, math.sqrt(k * mu2))
    mu2_max = budget_mu2(budget_eps, delta)
    assert remaining_queries(0.0, mu2_max, mu2) == k
    spent = 0.0
    for i in range(k):
        assert remaining_queries(spent, mu2_max, mu2) == k - i
        assert fits(spent, mu2, mu2_max)
        spent += mu2  # sequential float sums, as the ledger's UPDATE does
    assert remaining_queries(spent, mu2_max, mu2) == 0
    assert not fits(spent, mu2, mu2_max)
    assert spent_epsilon(spent, delta) == pytest.approx(budget_eps, rel=1e-6)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    k=st.integers(min_value=1, max_value=200),
    epsilon=st.floats(min_value=0.05, max_value=10.0),
)
def test_budget_split_into_k_equal_parts_fits_k(k: int, epsilon: float) -> None:
    mu2_max = budget_mu2(epsilon, 1e-5)
    per = mu2_max / k
    assert remaining_queries(0.0, mu2_max, per) == k
    spent = 0.0
    for _ in range(k):
        assert fits(spent, per, mu2_max)
        spent += per
    assert not fits(spent, per, mu2_max)


def test_remaining_queries_edges() -> None:
    assert MU2_RTOL == 1e-9
    assert mu2_limit(2.0) == 2.0 * (1 + MU2_RTOL)
    assert remaining_queries(0.0, 1.0, 0.3) == 3
    assert remaining_queries(0.95, 1.0, 0.3) == 0
    assert remaining_queries(2.0, 1.0, 0.3) == 0  # overspent (never by the ledger) -> 0
    # Within the tolerance: 1 + 1e-10 counts as 1.
    assert remaining_queries(0.0, 1.0, 0.5 * (1 + 1e-10)) == 2
    # Beyond it: not.
    assert remaining_queries(0.0, 1.0, 0.5 * (1 + 1e-8)) == 1
    with pytest.raises(ValueError, match="mu2_per_query"):
        remaining_queries(0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="mu2_spent"):
        remaining_queries(math.nan, 1.0, 0.1)
