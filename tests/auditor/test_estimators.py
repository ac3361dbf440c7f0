"""Estimators: Clopper-Pearson, GDP, the classical bound, exact curves and count estimates.

Reference values are computed here from scipy formulas (or dp-accounting), never by calling
the function under test. Randomised tests state their false-failure rate.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, stats

from dpicl_audit.errors import AuditError, InvalidAuditInput
from dpicl_audit.estimators import (
    AuditEstimate,
    ConfidenceSplit,
    analytic_sigma,
    classic_sigma,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_classic,
    estimate_from_counts,
    gaussian_epsilon_exact,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    mu_lower,
    per_interval_confidence,
)
from dpicl_audit.mechanisms.esa.exact import esa_epsilon_exact, esa_mean_sensitivity
from dpicl_audit.mechanisms.voting.exact import voting_epsilon_exact

# ----------------------------------------------------------------------------- Clopper-Pearson


@pytest.mark.parametrize("n", [1, 7, 100, 400_000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.999])
def test_clopper_pearson_closed_forms(n: int, confidence: float) -> None:
    # k = 0: P(0 successes) = (1 - p)^n = 1 - c at the bound.
    assert clopper_pearson_upper(0, n, confidence) == pytest.approx(
        1.0 - (1.0 - confidence) ** (1.0 / n), rel=1e-10
    )
    # k = n: p^n = 1 - c at the lower bound.
    assert clopper_pearson_lower(n, n, confidence) == pytest.approx(
        (1.0 - confidence) ** (1.0 / n), rel=1e-10
    )
    assert clopper_pearson_upper(n, n, confidence) == 1.0
    assert clopper_pearson_lower(0, n, confidence) == 0.0


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (17, 250), (5000, 40_000)])
def test_clopper_pearson_matches_binomtest(k: int, n: int) -> None:
    # binomtest's exact one-sided interval is the Clopper-Pearson bound.
    upper = stats.binomtest(k, n, alternative="less").proportion_ci(0.95, method="exact").high
    lower = stats.binomtest(k, n, alternative="greater").proportion_ci(0.95, method="exact").low
    assert clopper_pearson_upper(k, n, 0.95) == pytest.approx(upper, rel=1e-9, abs=1e-15)
    assert clopper_pearson_lower(k, n, 0.95) == pytest.approx(lower, rel=1e-9, abs=1e-15)


def test_clopper_pearson_vectorised() -> None:
    k = np.arange(0, 51)
    upper = clopper_pearson_upper(k, 50, 0.975)
    lower = clopper_pearson_lower(k, 50, 0.975)
    assert isinstance(upper, np.ndarray)
    assert upper.shape == (51,)
    np.testing.assert_allclose(upper[:50], stats.beta.ppf(0.975, k[:50] + 1, 50 - k[:50]))
    np.testing.assert_allclose(lower[1:], stats.beta.ppf(0.025, k[1:], 50 - k[1:] + 1))
    assert np.all(np.diff(upper) > 0)
    assert np.all(np.diff(lower) > 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10_000), st.data(), st.floats(0.5, 0.9999))
def test_clopper_pearson_brackets_the_estimate(n: int, data: st.DataObject, c: float) -> None:
    k = data.draw(st.integers(0, n))
    lo, hi = clopper_pearson_lower(k, n, c), clopper_pearson_upper(k, n, c)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_clopper_pearson_rejects_bad_input() -> None:
    with pytest.raises(InvalidAuditInput):
        clopper_pearson_upper(-1, 10, 0.95)
    with pytest.raises(InvalidAuditInput):
        clopper_pearson_upper(11, 10, 0.95)
    with pytest.raises(InvalidAuditInput):
        clopper_pearson_upper(1.5, 10, 0.95)  # type: ignore[call-overload]
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(InvalidAuditInput):
            clopper_pearson_lower(1, 10, bad)


def test_confidence_split_rules() -> None:
    assert per_interval_confidence(0.95, 2) == pytest.approx(0.975)
    assert per_interval_confidence(0.95, 2, "independent") == pytest.approx(math.sqrt(0.95))
    assert per_interval_confidence(0.95, 2, "per_interval") == 0.95
    assert per_interval_confidence(0.95, 4) == pytest.approx(0.9875)
    with pytest.raises(InvalidAuditInput):
        per_interval_confidence(0.95, 2, "nonsense")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- GDP


def _pld_epsilon(noise_multiplier: float, delta: float) -> float:
    accountant = PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier))
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize("mu", [0.2, 0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_gdp_epsilon_matches_pld_accountant(mu: float, delta: float) -> None:
    # mu-GDP is the Gaussian mechanism with noise multiplier 1 / mu.
    assert gdp_epsilon(mu, delta) == pytest.approx(_pld_epsilon(1.0 / mu, delta), rel=1e-3)


def _delta_by_quadrature(epsilon: float, mu: float) -> float:
    # delta(eps) = integral of (p1 - e^eps p0)_+ with p1 = N(mu, 1), p0 = N(0, 1); the privacy
    # loss mu x - mu^2/2 exceeds eps above x* = eps/mu + mu/2.
    x_star = epsilon / mu + mu / 2.0
    value, _ = integrate.quad(
        lambda x: stats.norm.pdf(x - mu) - math.exp(epsilon) * stats.norm.pdf(x),
        x_star,
        x_star + 40.0,
        epsabs=0.0,
        epsrel=1e-12,
        limit=200,
    )
    return float(value)


@pytest.mark.parametrize(
    ("epsilon", "mu"), [(0.0, 0.5), (0.5, 0.5), (1.0, 1.0), (3.0, 1.0), (5.0, 2.0), (10.0, 3.0)]
)
def test_gdp_delta_matches_numerical_integration(epsilon: float, mu: float) -> None:
    assert gdp_delta(epsilon, mu) == pytest.approx(_delta_by_quadrature(epsilon, mu), rel=1e-8)


def test_gdp_delta_edges_and_vectorisation() -> None:
    assert gdp_delta(1.0, 0.0) == 0.0
    assert gdp_delta(0.0, math.inf) == 1.0
    # tiny deltas keep full relative precision (log-space difference)
    tiny = gdp_delta(40.0, 2.0)
    assert 0.0 < tiny < 1e-80
    assert tiny == pytest.approx(_delta_by_quadrature(40.0, 2.0), rel=1e-6)
    grid = gdp_delta(np.array([0.5, 1.0, 2.0]), 1.0)
    assert isinstance(grid, np.ndarray)
    assert np.all(np.diff(grid) < 0)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.05, 8.0), st.sampled_from([1e-3, 1e-5, 1e-7, 1e-10]))
def test_gdp_epsilon_inverts_gdp_delta(mu: float, delta: float) -> None:
    eps = gdp_epsilon(mu, delta)
    if eps > 0.0:
        assert gdp_delta(eps, mu) == pytest.approx(delta, rel=1e-6)
        assert gdp_mu(eps, delta) == pytest.approx(mu, rel=1e-6)
    else:
        assert gdp_delta(0.0, mu) <= delta


def test_gdp_epsilon_edges() -> None:
    assert gdp_epsilon(0.0, 1e-5) == 0.0
    assert gdp_epsilon(-1.0, 1e-5) == 0.0
    assert gdp_epsilon(1e-7, 1e-5) == 0.0  # delta(0; mu) = 2 Phi(mu/2) - 1 < 1e-5
    with pytest.raises(InvalidAuditInput):
        gdp_epsilon(1.0, 0.0)


def test_mu_lower_formula_and_split() -> None:
    fp, n_neg, fn, n_pos = 120, 1000, 80, 1000
    splits: tuple[tuple[ConfidenceSplit, float], ...] = (
        ("bonferroni", 0.975),
        ("independent", math.sqrt(0.95)),
    )
    for split, c_each in splits:
        fpr_u = stats.beta.ppf(c_each, fp + 1, n_neg - fp)
        fnr_u = stats.beta.ppf(c_each, fn + 1, n_pos - fn)
        expected = stats.norm.ppf(1 - fnr_u) - stats.norm.ppf(fpr_u)
        got = mu_lower(fp, n_neg, fn, n_pos, 0.95, split=split)
        assert got == pytest.approx(expected, rel=1e-10)
    # a useless attack proves nothing: clipped at 0
    assert mu_lower(600, 1000, 600, 1000, 0.95) == 0.0
    arr = mu_lower(np.array([10, 100, 500]), 1000, np.array([10, 100, 500]), 1000)
    assert arr.shape == (3,)
    assert np.all(np.diff(arr) < 0)


# ----------------------------------------------------------------------------- classical bound


def test_classic_bound_formula() -> None:
    fp, n_neg, fn, n_pos, delta = 30, 5000, 900, 5000, 1e-5
    fpr_u = stats.beta.ppf(0.975, fp + 1, n_neg - fp)
    fnr_u = stats.beta.ppf(0.975, fn + 1, n_pos - fn)
    expected = max(
        math.log((1 - delta - fnr_u) / fpr_u), math.log((1 - delta - fpr_u) / fnr_u), 0.0
    )
    assert epsilon_lower_classic(fp, n_neg, fn, n_pos, delta, 0.95) == pytest.approx(
        expected, rel=1e-10
    )
    assert epsilon_lower_classic(500, 1000, 500, 1000, delta, 0.95) == 0.0


# ----------------------------------------------------------------------------- counts


def _reference(tp: int, fn: int, fp: int, tn: int, delta: float, c: float) -> dict[str, float]:
    """Independent reference: scipy's beta/normal quantiles and the plain GDP formula."""
    c_each = 1 - (1 - c) / 2
    n_pos, n_neg = tp + fn, fp + tn
    fpr_u = 1.0 if fp == n_neg else stats.beta.ppf(c_each, fp + 1, n_neg - fp)
    fnr_u = 1.0 if fn == n_pos else stats.beta.ppf(c_each, fn + 1, n_pos - fn)
    mu = max(0.0, float(stats.norm.ppf(1 - fnr_u) - stats.norm.ppf(fpr_u)))

    def delta_of(eps: float) -> float:
        return float(
            stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        )

    if mu == 0.0 or delta_of(0.0) <= delta:
        eps = 0.0
    else:
        eps = optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 200.0, xtol=1e-12)
    classic = 0.0
    if 1 - delta - fnr_u > 0:
        classic = max(classic, math.log((1 - delta - fnr_u) / fpr_u))
    if 1 - delta - fpr_u > 0:
        classic = max(classic, math.log((1 - delta - fpr_u) / fnr_u))
    return {"mu_lower": mu, "epsilon_lower": eps, "epsilon_lower_classic": classic}


@pytest.mark.parametrize(
    ("tp", "fn", "fp", "tn", "delta", "confidence"),
    [
        (900, 100, 100, 900, 1e-5, 0.95),
        (5000, 5000, 4000, 6000, 1e-5, 0.95),
        (400_000, 0, 0, 400_000, 1e-5, 0.95),
        (123, 877, 2, 998, 1e-6, 0.99),
        (50, 50, 50, 50, 1e-5, 0.95),
    ],
)
def test_estimate_from_counts_against_reference(
    tp: int, fn: int, fp: int, tn: int, delta: float, confidence: float
) -> None:
    est = estimate_from_counts(tp, fn, fp, tn, delta=delta, confidence=confidence)
    ref = _reference(tp, fn, fp, tn, delta, confidence)
    assert est.mu_lower == pytest.approx(ref["mu_lower"], rel=1e-9, abs=1e-12)
    assert est.epsilon_lower == pytest.approx(ref["epsilon_lower"], rel=1e-7, abs=1e-9)
    assert est.epsilon_lower_classic == pytest.approx(
        ref["epsilon_lower_classic"], rel=1e-9, abs=1e-12
    )
    assert est.tpr == tp / (tp + fn)
    assert est.fpr == fp / (fp + tn)


def test_estimate_to_dict_is_json_ready() -> None:
    import json

    est = estimate_from_counts(900, 100, 100, 900, delta=1e-5, confidence=0.95)
    assert isinstance(est, AuditEstimate)
    data = json.loads(json.dumps(est.to_dict()))
    for key in ("mu_lower", "epsilon_lower", "epsilon_lower_classic", "tp", "fn", "fp", "tn"):
        assert key in data
    assert data["confidence"] == 0.95
    assert data["split"] == "bonferroni"
    assert data["n_pos"] == 1000
    with pytest.raises(AttributeError):
        est.tp = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tp": -1, "fn": 1, "fp": 1, "tn": 1}, "tp"),
        ({"tp": 1, "fn": 1, "fp": 1, "tn": -5}, "tn"),
        ({"tp": 1.5, "fn": 1, "fp": 1, "tn": 1}, "tp"),
        ({"tp": 0, "fn": 0, "fp": 1, "tn": 1}, "at least one"),
        ({"tp": 1, "fn": 1, "fp": 1, "tn": 1, "confidence": 1.0}, "confidence"),
        ({"tp": 1, "fn": 1, "fp": 1, "tn": 1, "confidence": 0.0}, "confidence"),
        ({"tp": 1, "fn": 1, "fp": 1, "tn": 1, "delta": 0.0}, "delta"),
    ],
)
def test_estimate_from_counts_validates(kwargs: dict[str, float], needle: str) -> None:
    args = {"delta": 1e-5, "confidence": 0.95, **kwargs}
    with pytest.raises(InvalidAuditInput, match=needle) as info:
        estimate_from_counts(**args)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, AuditError)


def test_estimates_cover_the_truth() -> None:
    # Coverage: for a Gaussian-shift attack with known mu (the optimal test at a fixed
    # threshold, so its rates are exactly Phi-shaped), P(mu_lower > mu) <= 5% by construction.
    # Over 400 independent repetitions the count of violations is Binomial(400, <= 0.05);
    # failing above binom.ppf(1 - 1e-4) makes the false-failure rate <= 1e-4.
    rng = np.random.default_rng(20240601)
    mu, n, reps, delta = 1.0, 2000, 400, 1e-5
    eps_true = gdp_epsilon(mu, delta)
    threshold = mu / 2
    tp = rng.binomial(n, stats.norm.sf(threshold - mu), size=reps)
    fp = rng.binomial(n, stats.norm.sf(threshold), size=reps)
    over_mu = over_classic = 0
    for t, f in zip(tp, fp, strict=True):
        est = estimate_from_counts(int(t), n - int(t), int(f), n - int(f), delta=delta)
        over_mu += est.mu_lower > mu
        over_classic += est.epsilon_lower_classic > eps_true
    limit = stats.binom.ppf(1 - 1e-4, reps, 0.05)
    assert over_mu <= limit
    assert over_classic <= limit


# ----------------------------------------------------------------------------- exact curves


def test_theory_sigmas() -> None:
    delta = 1e-5
    # 000, Algorithm 2: sigma = 2 sqrt(ln(1.25/delta)) / epsilon for Delta2 = sqrt(2)
    assert classic_sigma(1.0, delta) == pytest.approx(2 * math.sqrt(math.log(1.25 / delta)))
    assert classic_sigma(2.0, delta, 0.2) == pytest.approx(
        0.2 * math.sqrt(2 * math.log(1.25 / delta)) / 2.0
    )
    for eps in (0.5, 1.0, 4.0):
        sigma = analytic_sigma(eps, delta)
        assert gaussian_epsilon_exact(sigma, math.sqrt(2), delta) == pytest.approx(eps, rel=1e-3)
        if eps <= 1.0:  # the classical formula is valid (and loose) below 1
            assert sigma < classic_sigma(eps, delta)


def test_exact_epsilons() -> None:
    delta = 1e-5
    sigma = 3.0
    # voting: Gaussian with sensitivity sqrt(2), i.e. noise multiplier sigma / sqrt(2)
    assert voting_epsilon_exact(sigma, delta) == pytest.approx(
        _pld_epsilon(sigma / math.sqrt(2), delta), rel=1e-3
    )
    assert voting_epsilon_exact(sigma, delta) == pytest.approx(
        gdp_epsilon(math.sqrt(2) / sigma, delta), rel=1e-3
    )
    # composition: 4 releases = one with mu * 2
    assert voting_epsilon_exact(sigma, delta, count=4) == pytest.approx(
        gdp_epsilon(2 * math.sqrt(2) / sigma, delta), rel=1e-3
    )
    shift = np.array([0.1, 0.0, -0.1])
    assert esa_epsilon_exact(0.5, shift, delta) == pytest.approx(
        gdp_epsilon(float(np.linalg.norm(shift)) / 0.5, delta), rel=1e-3
    )
    assert esa_epsilon_exact(0.5, 0.0, delta) == 0.0
    assert esa_mean_sensitivity(10) == pytest.approx(0.2)
    assert esa_mean_sensitivity(10, original=True) == 1.0
    with pytest.raises(InvalidAuditInput):
        gaussian_epsilon_exact(0.0, 1.0, delta)


def test_exact_epsilon_is_computed_once_per_sigma_and_delta() -> None:
    """Issue 13, item 3: what depends only on (sigma, delta) is cached, and the cached value
    is the one a fresh PLD accountant gives."""
    from dpicl_audit.estimators.exact import _pld_epsilon
    from dpicl_audit.mechanisms.voting.exact import voting_epsilon_exact

    sigma = 1.2345678
    first = voting_epsilon_exact(sigma, 1e-5)
    hits = _pld_epsilon.cache_info().hits
    assert voting_epsilon_exact(sigma, 1e-5) == first
    assert _pld_epsilon.cache_info().hits == hits + 1
    fresh = _pld_epsilon.__wrapped__(sigma / math.sqrt(2.0), 1e-5, 1, 1e-4)
    assert fresh == first


def test_counts_past_2_53_are_named() -> None:
    # --tp 1e23 failed deep in numpy with "n must hold counts, got dtype object".
    with pytest.raises(InvalidAuditInput, match=r"tp must be at most 9007199254740992 \(2\^53\)"):
        estimate_from_counts(10**23, 10, 5, 95, delta=1e-5)
    est = estimate_from_counts(2**53, 2**53, 2**53, 2**53, delta=1e-5)
    assert est.epsilon_lower == 0.0


def test_one_gaussian_release_below_the_threshold_is_the_closed_form() -> None:
    """Below CLOSED_FORM_BELOW one release's epsilon is Balle and Wang's closed form (the
    PLD took 1-6 s a value there): it agrees with the PLD to 1e-6 relative on both sides of
    the threshold, and a tiny sigma (a broken server's) costs no time and no memory."""
    import time

    from dpicl_audit.estimators.exact import CLOSED_FORM_BELOW, _pld_epsilon
    from dpicl_audit.estimators.gdp import gdp_epsilon

    for multiplier in (CLOSED_FORM_BELOW * 0.9, CLOSED_FORM_BELOW * 1.1):
        sigma = multiplier * math.sqrt(2.0)
        got = gaussian_epsilon_exact(sigma, math.sqrt(2.0), 1e-5)
        pld = _pld_epsilon(multiplier, 1e-5, 1, 1e-4)
        assert got == pytest.approx(pld, rel=1e-6)
        assert got == pytest.approx(gdp_epsilon(1.0 / multiplier, 1e-5), rel=1e-6)
    t0 = time.monotonic()
    tiny = gaussian_epsilon_exact(1e-3, math.sqrt(2.0), 1e-5)
    assert math.isfinite(tiny) and tiny > 1e5 and time.monotonic() - t0 < 1.0
