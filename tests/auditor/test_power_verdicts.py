"""Reachable epsilon of a design (power) and the verdict rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import classic_sigma, estimate_from_counts, gdp_epsilon
from dpicl_audit.estimators.label_release import (
    label_release_probabilities,
    pivotal_design,
    pivotal_rates,
)
from dpicl_audit.estimators.power import (
    flip_rate_from_signals,
    max_reachable_epsilon,
    reachable_from_rates,
)
from dpicl_audit.estimators.verdict_rules import decide_verdict
from dpicl_audit.mechanisms.voting.exact import voting_epsilon_exact

DELTA = 1e-5


@pytest.mark.parametrize("n", [10, 100, 1000, 10_000])
def test_perfect_separation_ceiling_is_the_closed_form(n: int) -> None:
    # fp = fn = 0: both upper bounds are 1 - (alpha / 2)^(1/n) (Bonferroni at 95%).
    u = 1.0 - 0.025 ** (1.0 / n)
    expected = math.log((1.0 - DELTA - u) / u)
    got = max_reachable_epsilon(n, n, delta=DELTA)
    assert got.epsilon == pytest.approx(expected, rel=1e-9)
    assert got.epsilon == pytest.approx(
        estimate_from_counts(n, 0, 0, n, delta=DELTA).epsilon_lower_classic
    )


def test_no_flips_no_power_and_monotone_in_flips_and_trials() -> None:
    assert max_reachable_epsilon(5000, 5000, delta=DELTA, flip_rate=0.0).epsilon == 0.0
    assert (
        max_reachable_epsilon(5000, 5000, delta=DELTA, flip_rate=0.0, figure="gdp").epsilon == 0.0
    )
    by_flips = [
        max_reachable_epsilon(2000, 2000, delta=DELTA, flip_rate=q).epsilon
        for q in (0.05, 0.2, 0.5, 1.0)
    ]
    assert by_flips == sorted(by_flips) and by_flips[0] < by_flips[-1]
    by_n = [
        max_reachable_epsilon(n, n, delta=DELTA, mu=1.5, figure="gdp").epsilon
        for n in (100, 1000, 100_000)
    ]
    assert by_n == sorted(by_n)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_gdp_reach_approaches_the_mechanisms_epsilon(mu: float) -> None:
    reach = max_reachable_epsilon(2_000_000, 2_000_000, delta=DELTA, mu=mu, figure="gdp")
    truth = gdp_epsilon(mu, DELTA)
    assert 0.9 * truth < reach.epsilon <= truth
    assert reach.mu <= mu


def test_reach_predicts_a_simulated_audit() -> None:
    # At the GDP-optimal threshold the realised bound of simulated trials stays near the
    # prediction: over 200 seeds (4,000 trials per world, mu = 1.65) its mean was 7.38 against
    # the predicted 7.40, its standard deviation 0.18 and its largest deviation 0.51. The
    # tolerance 0.75 is 4.2 standard deviations: false-failure rate about 3e-5 (seed fixed).
    rng = np.random.default_rng(3)
    n, mu, q = 4000, 1.65, 1.0
    reach = max_reachable_epsilon(n, n, delta=DELTA, mu=mu, flip_rate=q, figure="gdp")
    neg = rng.normal(size=n)
    pos = rng.normal(mu, 1.0, size=n)
    thr = mu / 2.0  # the GDP-optimal symmetric threshold
    est = estimate_from_counts(
        int(np.sum(pos > thr)),
        int(np.sum(pos <= thr)),
        int(np.sum(neg > thr)),
        int(np.sum(neg <= thr)),
        delta=DELTA,
    )
    assert abs(est.epsilon_lower - reach.epsilon) < 0.75


def test_black_box_reach_separates_the_paper_design_from_the_pivotal_one() -> None:
    # Expected counts of the decision "released A" with 4,000 trials per world at epsilon 8:
    # the paper's [1, 7] vs [0, 8] has both rates in the far tail and reaches almost nothing;
    # the pivotal design reaches most of the mechanism's GDP epsilon.
    sigma = classic_sigma(8.0, DELTA)
    exact = voting_epsilon_exact(sigma, DELTA)
    paper = (
        float(label_release_probabilities([1, 7], sigma)[0]),
        float(label_release_probabilities([0, 8], sigma)[0]),
    )
    tpr, fpr, _ = pivotal_rates(pivotal_design(5), sigma)
    assert reachable_from_rates(4000, 4000, *paper, delta=DELTA) < 0.1 * exact
    assert reachable_from_rates(4000, 4000, tpr, fpr, delta=DELTA) > 0.8 * exact
    e = estimate_from_counts(
        round(tpr * 4000),
        4000 - round(tpr * 4000),
        round(fpr * 4000),
        4000 - round(fpr * 4000),
        delta=DELTA,
    )
    assert (
        reachable_from_rates(4000, 4000, tpr, fpr, delta=DELTA, figure="classical")
        == e.epsilon_lower_classic
    )


def test_flip_rate_from_signals() -> None:
    a = np.array([[1, 3], [2, 2], [0, 4], [1, 3]])
    b = np.array([[0, 4], [2, 2], [0, 4], [0, 4]])
    assert flip_rate_from_signals(a, b) == 0.5
    with pytest.raises(InvalidAuditInput):
        flip_rate_from_signals(a, b[:3])


@pytest.mark.parametrize("bad", [{"flip_rate": 1.5}, {"mu": -1.0}, {"figure": "x"}])
def test_reach_rejects_bad_input(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidAuditInput):
        max_reachable_epsilon(10, 10, delta=DELTA, **bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidAuditInput):
        max_reachable_epsilon(0, 10, delta=DELTA)


BASE = {"epsilon_theory": 4.0, "epsilon_exact": 3.5, "mu_exact": 1.0, "mu_claimed": 1.1}


def test_gaussian_claim_violated_by_mu_alone() -> None:
    v = decide_verdict(
        claim="gaussian", epsilon_classical=1.0, mu_lower=1.2, max_reachable=3.0, **BASE
    )
    assert v.verdict == "VIOLATION" and "mu_lower" in v.reasons[0]


def test_other_claim_ignores_mu_and_reads_the_classical_bound() -> None:
    kw = {"epsilon_theory": 4.0, "epsilon_exact": 5.0, "max_reachable": 4.0}
    assert (
        decide_verdict(claim="other", epsilon_classical=1.0, mu_lower=9.0, **kw).verdict
        == "CONSISTENT"
    )
    assert decide_verdict(claim="other", epsilon_classical=4.5, **kw).verdict == "VIOLATION"


def test_bug_when_above_exact_but_not_the_claim() -> None:
    v = decide_verdict(
        claim="gaussian", epsilon_classical=3.7, mu_lower=0.9, max_reachable=3.0, **BASE
    )
    assert v.verdict == "BUG"
    v = decide_verdict(
        claim="gaussian", epsilon_classical=1.0, mu_lower=1.05, max_reachable=3.0, **BASE
    )
    assert v.verdict == "BUG"


def test_inconclusive_without_signal_or_power() -> None:
    v = decide_verdict(
        claim="gaussian",
        epsilon_classical=0.0,
        mu_lower=0.0,
        flip_rate=0.0,
        max_reachable=3.0,
        **BASE,
    )
    assert v.verdict == "INCONCLUSIVE" and "never differed" in v.reasons[0] and v.advice
    v = decide_verdict(
        claim="gaussian",
        epsilon_classical=0.0,
        mu_lower=0.0,
        flip_rate=0.1,
        max_reachable=1.0,
        **BASE,
    )
    assert v.verdict == "INCONCLUSIVE" and "1.75" in v.reasons[0]
    assert any("more trials" in a for a in v.advice) and any("10%" in a for a in v.advice)
    v = decide_verdict(claim="gaussian", epsilon_classical=0.0, mu_lower=0.0, **BASE)
    assert v.verdict == "INCONCLUSIVE" and "not assessed" in v.reasons[0]


def test_consistent_only_with_power_and_violation_beats_no_power() -> None:
    v = decide_verdict(
        claim="gaussian",
        epsilon_classical=2.0,
        mu_lower=0.8,
        flip_rate=1.0,
        max_reachable=3.0,
        **BASE,
    )
    assert v.verdict == "CONSISTENT"
    # a proven violation stands even when the design was weak
    v = decide_verdict(
        claim="gaussian", epsilon_classical=5.0, mu_lower=0.8, max_reachable=0.1, **BASE
    )
    assert v.verdict == "VIOLATION"


@pytest.mark.parametrize(
    "bad",
    [
        {"claim": "x"},
        {"epsilon_theory": 0.0},
        {"epsilon_classical": float("nan")},
        {"mu_claimed": None},
        {"flip_rate": 2.0},
        {"min_power_fraction": 0.0},
    ],
)
def test_verdict_rejects_bad_input(bad: dict[str, object]) -> None:
    kw: dict[str, object] = {
        "claim": "gaussian",
        "epsilon_classical": 1.0,
        "mu_lower": 0.5,
        **BASE,
        **bad,
    }
    with pytest.raises(InvalidAuditInput):
        decide_verdict(**kw)  # type: ignore[arg-type]
