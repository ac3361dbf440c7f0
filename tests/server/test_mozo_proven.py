"""Accounting of DPS-MOZO's proven mode: amplification, exact optimal composition (checked
against Kairouz-Oh-Viswanath's sum and dp-accounting's PLD) and the eps0 calibration."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpicl.errors import ConfigurationError
from dpicl.mechanisms.dps_mozo.proven import (
    EPS0_MAX,
    amplified_epsilon,
    calibrate_max_log_ratio,
    composed_delta,
    composed_epsilon,
    composed_epsilon_pld,
    kov_delta,
    per_token_epsilon,
    proven_epsilon,
)


def kov_delta_exact(epsilon: Fraction, steps: int, i: int) -> float:
    """KOV Theorem 3.3 in exact rational arithmetic, with e^eps given as a rational ``r``:
    ``sum_{l<i} C(k,l) (r^{k-l} - r^{k-2i+l}) / (1+r)^k``."""
    r = epsilon
    total = Fraction(0)
    for l_ in range(i):
        total += math.comb(steps, l_) * (r ** (steps - l_) - r ** (steps - 2 * i + l_))
    return float(total / (1 + r) ** steps)


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 20, 60])
@pytest.mark.parametrize("ratio", [Fraction(11, 10), Fraction(3, 2), Fraction(5, 1)])
def test_composed_delta_is_kov_optimal_composition(steps: int, ratio: Fraction) -> None:
    eps = math.log(ratio)
    for i in range(steps // 2 + 1):
        exact = kov_delta_exact(ratio, steps, i)
        assert composed_delta((steps - 2 * i) * eps, eps, steps) == pytest.approx(
            exact, rel=1e-9, abs=1e-15
        )
        assert kov_delta(eps, steps, i) == pytest.approx(exact, rel=1e-9, abs=1e-15)


def test_one_step_is_randomized_response() -> None:
    # One eps-DP step: delta(E) = (e^eps - e^E) / (1 + e^eps) for E < eps, 0 beyond.
    eps = 0.7
    for e in (0.0, 0.1, 0.5, 0.69):
        assert composed_delta(e, eps, 1) == pytest.approx(
            (math.exp(eps) - math.exp(e)) / (1 + math.exp(eps)), rel=1e-12
        )
    assert composed_delta(0.7, eps, 1) == 0.0
    delta = 0.05
    assert composed_epsilon(eps, 1, delta) == pytest.approx(
        math.log(math.exp(eps) - delta * (1 + math.exp(eps))), abs=1e-10
    )


@pytest.mark.parametrize(
    ("eps", "steps", "delta"),
    [(0.01, 1000, 1e-5), (0.05, 300, 1e-6), (0.3, 40, 1e-3), (1.0, 5, 1e-2)],
)
def test_composed_epsilon_matches_dp_accounting_pld(eps: float, steps: int, delta: float) -> None:
    exact = composed_epsilon(eps, steps, delta)
    pld = composed_epsilon_pld(eps, steps, delta)
    # PLD on the randomized-response pair is pessimistic: never below the exact optimal
    # composition, and within 2e-4 relative of it at this grid (eps lies on the grid).
    assert exact - 1e-9 <= pld <= exact * (1 + 2e-4) + 1e-8
    assert composed_delta(exact, eps, steps) <= delta
    # Far tighter than basic composition, never above it.
    assert exact <= steps * eps


def test_composed_epsilon_amplified_case_matches_pld() -> None:
    eps = amplified_epsilon(4 * 0.05, 4 / 24)
    exact = composed_epsilon(eps, 480, 1e-3)
    pld = composed_epsilon_pld(eps, 480, 1e-3, value_discretization_interval=1e-5)
    # PLD rounds the losses up to its grid: never below the exact value, and close.
    assert exact <= pld + 1e-9
    assert pld - exact < 480 * 1e-5


def test_amplification_formula() -> None:
    assert amplified_epsilon(1.0, 1.0) == pytest.approx(1.0)
    assert amplified_epsilon(1.0, 0.1) == pytest.approx(math.log(1 + 0.1 * (math.e - 1)))
    assert amplified_epsilon(0.0, 0.3) == 0.0
    with pytest.raises(ConfigurationError, match="sampling rate"):
        amplified_epsilon(1.0, 0.0)


def test_per_token_epsilon() -> None:
    assert per_token_epsilon(0.1, 1) == pytest.approx(0.2)
    assert per_token_epsilon(0.1, 4) == pytest.approx(0.4)
    with pytest.raises(ConfigurationError, match="n_shots"):
        per_token_epsilon(0.1, 0)
    with pytest.raises(ConfigurationError, match="max_log_ratio"):
        per_token_epsilon(-1.0, 2)


@settings(max_examples=40, deadline=None)
@given(
    epsilon=st.floats(0.05, 16.0),
    log_delta=st.floats(-12.0, -1.0),
    n_shots=st.integers(1, 8),
    n_exemplars=st.integers(8, 5000),
    tokens=st.integers(1, 10**7),
)
def test_calibration_never_overshoots_and_is_tight(
    epsilon: float, log_delta: float, n_shots: int, n_exemplars: int, tokens: int
) -> None:
    delta = 10.0**log_delta
    q = n_shots / n_exemplars
    cal = calibrate_max_log_ratio(epsilon, delta, n_shots, q, tokens)
    spent = proven_epsilon(cal.max_log_ratio, n_shots, q, tokens, delta)
    assert spent <= epsilon
    assert cal.epsilon_spent == spent
    if cal.max_log_ratio < EPS0_MAX:
        # 1e-6 relative more eps0 would overshoot: the calibration is tight.
        assert proven_epsilon(cal.max_log_ratio * (1 + 1e-6), n_shots, q, tokens, delta) > epsilon
    assert cal.per_token_epsilon == per_token_epsilon(cal.max_log_ratio, n_shots)


def test_calibration_cost_is_bounded_for_huge_token_counts() -> None:
    # 10^6 queries of 1024 tokens: the closed form does O(1) work per evaluation.
    cal = calibrate_max_log_ratio(1.0, 1e-6, 4, 4 / 10_000, 1_000_000 * 1024)
    assert 0.0 < cal.max_log_ratio < 1.0
    assert cal.epsilon_spent <= 1.0


def test_calibration_rejects_bad_values() -> None:
    with pytest.raises(ConfigurationError, match="epsilon"):
        calibrate_max_log_ratio(0.0, 1e-5, 4, 0.1, 10)
    with pytest.raises(ConfigurationError, match="delta"):
        calibrate_max_log_ratio(1.0, 1.0, 4, 0.1, 10)
    with pytest.raises(ConfigurationError, match="tokens"):
        calibrate_max_log_ratio(1.0, 1e-5, 4, 0.1, 0)


def test_cli_calibrate_proven_prints_eps0_and_per_token_epsilon() -> None:
    import json

    from typer.testing import CliRunner

    from dpicl.cli import app

    args = ["calibrate", "--mechanism", "dps-mozo", "--epsilon", "1", "--delta", "1e-5"]
    args += ["--tokens", "4800", "--sample-rate", "0.004", "--n-shots", "4"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    cal = calibrate_max_log_ratio(1.0, 1e-5, 4, 0.004, 4800)
    assert out["guarantee"] == "proven"
    assert out["max_log_ratio"] == pytest.approx(cal.max_log_ratio)
    assert out["per_token_epsilon"] == pytest.approx(4 * cal.max_log_ratio)
    assert out["epsilon_spent"] <= 1.0
    res = CliRunner().invoke(app, [*args, "--alpha", "3"])
    assert res.exit_code == 2 and "alpha" in res.output
