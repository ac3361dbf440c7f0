"""Bootstrap auditing (paper 000, Algorithm 1): distributions, tightness, positive controls.

All generators are seeded, so every run is reproducible; the false-failure rates stated below
are the probabilities of failing over a fresh seed when the code is right.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import classic_sigma, estimate_from_counts
from dpicl_audit.mechanisms.esa.exact import esa_epsilon_exact
from dpicl_audit.mechanisms.esa.simulation import bootstrap_esa_audit, simulate_esa
from dpicl_audit.mechanisms.voting import bootstrap as voting_bootstrap
from dpicl_audit.mechanisms.voting.bootstrap import bootstrap_voting_audit, simulate_voting
from dpicl_audit.mechanisms.voting.exact import voting_epsilon_exact

DELTA = 1e-5
T = 10
CLEAN_WITH = np.array([[1, T - 1]])  # Lemma 3.1's pattern: one partition votes "yes"
CLEAN_WITHOUT = np.array([[0, T]])
# Upper checks use the held-out counts at this confidence: with 4 cases each fails with
# probability <= 1e-6 when the code is right.
UPPER_CONFIDENCE = 1 - 1e-6


def _two_sided_binom_ok(k: int, n: int, p: float, alpha: float) -> bool:
    return bool(stats.binomtest(k, n, p).pvalue > alpha)


# ----------------------------------------------------------------------------- simulate_voting


def test_tie_breaking_is_uniform() -> None:
    # sigma = 0: the histograms are the clean rows, so every argmax is a tie.
    # [5, 5, 1]: positive wins half the time; [5, 5, 5]: a third. Exact binomial tests at
    # 5e-5 each: false-failure rate <= 1e-4.
    rng = np.random.default_rng(1)
    n = 200_000
    sim = simulate_voting(
        [[5, 5, 1]], [[5, 5, 5]], 0.0, n, positive_index=0, negative_index=1, rng=rng
    )
    assert _two_sided_binom_ok(int(sim.decisions_with.sum()), n, 1 / 2, 5e-5)
    assert _two_sided_binom_ok(int(sim.decisions_without.sum()), n, 1 / 3, 5e-5)
    np.testing.assert_array_equal(sim.scores_with, 0.0)


def test_rows_are_resampled_uniformly_with_replacement() -> None:
    # sigma = 0 again; the positive label wins only on the first of four rows (1/4), and the
    # score is the row's vote gap. Binomial test at 5e-5, z-test on the gap mean at 5e-5
    # (the gap is bounded, n is large): false-failure rate <= 1e-4.
    rng = np.random.default_rng(2)
    rows = np.array([[3, 1], [1, 3], [1, 3], [0, 4]])
    n = 200_000
    sim = simulate_voting(rows, rows, 0.0, n, positive_index=0, negative_index=1, rng=rng)
    assert _two_sided_binom_ok(int(sim.decisions_with.sum()), n, 1 / 4, 5e-5)
    gaps = rows[:, 0] - rows[:, 1]
    assert set(np.unique(sim.scores_without)) <= set(gaps.astype(float))
    z = (sim.scores_without.mean() - gaps.mean()) / (gaps.std() / math.sqrt(n))
    assert abs(z) < stats.norm.isf(5e-5 / 2)


def test_noisy_scores_and_decisions_follow_the_gaussian_model() -> None:
    # One clean row [2, 6, 1] with sigma = 3: the score is N(-4, 2 sigma^2) exactly, and
    # P(argmax = label 0) is a 1-D integral. KS test and binomial test at 5e-5 each:
    # false-failure rate <= 1e-4.
    rng = np.random.default_rng(3)
    sigma, n = 3.0, 100_000
    sim = simulate_voting(
        [[2, 6, 1]], [[2, 6, 1]], sigma, n, positive_index=0, negative_index=1, rng=rng
    )
    ks = stats.kstest(sim.scores_with, stats.norm(-4.0, sigma * math.sqrt(2)).cdf)
    assert ks.pvalue > 5e-5
    p_win = _argmax_probability([2, 6, 1], sigma, 0)
    assert _two_sided_binom_ok(int(sim.decisions_without.sum()), n, p_win, 5e-5)


def _argmax_probability(counts: list[int], sigma: float, c: int) -> float:
    from scipy import integrate

    others = [x for i, x in enumerate(counts) if i != c]

    def f(t: float) -> float:
        x = counts[c] + sigma * t
        return float(stats.norm.pdf(t) * np.prod(stats.norm.cdf((x - np.array(others)) / sigma)))

    return float(integrate.quad(f, -12, 12, limit=200)[0])


def test_chunking_keeps_results_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small chunks (many loop iterations) and many labels: shapes, and a frequency check.
    # Binomial test at 1e-4: false-failure rate <= 1e-4.
    monkeypatch.setattr(voting_bootstrap, "CHUNK_ELEMENTS", 1000)
    rng = np.random.default_rng(4)
    labels = 40
    row = np.zeros((1, labels))
    row[0, :2] = 5.0  # two tied leaders, noise 0: positive wins half of the time
    n = 50_001
    sim = simulate_voting(row, row, 0.0, n, positive_index=0, negative_index=1, rng=rng)
    assert sim.decisions_with.shape == (n,)
    assert sim.scores_without.shape == (n,)
    assert _two_sided_binom_ok(int(sim.decisions_with.sum()), n, 0.5, 1e-4)


def test_simulate_voting_speed_smoke() -> None:
    # Smoke check, not a benchmark (bench/audit.py measures): 400,000 trials per world.
    rng = np.random.default_rng(5)
    sigma = classic_sigma(1.0, DELTA)
    simulate_voting(
        CLEAN_WITH, CLEAN_WITHOUT, sigma, 1000, positive_index=0, negative_index=1, rng=rng
    )  # warm-up
    start = time.perf_counter()
    sim = simulate_voting(
        CLEAN_WITH, CLEAN_WITHOUT, sigma, 400_000, positive_index=0, negative_index=1, rng=rng
    )
    assert time.perf_counter() - start < 2.0
    assert sim.scores_with.shape == (400_000,)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"clean_with": [1, 2]}, "clean_with"),
        ({"clean_without": [[1, 2, 3]]}, "labels"),
        ({"sigma": -1.0}, "sigma"),
        ({"n_sample": 0}, "n_sample"),
        ({"positive_index": 5}, "positive_index"),
        ({"negative_index": 0}, "differ"),
        ({"clean_with": [[np.nan, 1.0]]}, "finite"),
    ],
)
def test_simulate_voting_validates(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {
        "clean_with": [[1, 9]],
        "clean_without": [[0, 10]],
        "sigma": 1.0,
        "n_sample": 10,
        "positive_index": 0,
        "negative_index": 1,
        "rng": np.random.default_rng(0),
    }
    args.update(kwargs)
    with pytest.raises(InvalidAuditInput, match=needle):
        simulate_voting(**args)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- tightness

EPSILONS = [1.0, 2.0, 4.0, 8.0]


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_bootstrap_voting_audit_is_tight(epsilon: float) -> None:
    # [1, T-1] vs [0, T] at the classical sigma, 400,000 trials per world. The white-box
    # score noisy[yes] - noisy[no] is N(-8 or -10, 2 sigma^2): exactly the Gaussian mechanism
    # of sensitivity sqrt(2), so the held-out bound should reach epsilon_exact up to the
    # confidence margin.
    # Lower check (>= 0.9 epsilon_exact) false-failure rate: over 100 seeds the ratio was
    # 0.956 +- 0.015 at epsilon 1 (3.7 sd above 0.9: about 1e-4 under a normal
    # approximation), 0.977 +- 0.008 at 2 and >= 0.988 +- 0.004 at 4 and 8 (> 9 sd: nil).
    # Upper check (<= epsilon_exact) holds with probability >= UPPER_CONFIDENCE: the held-out
    # counts are re-evaluated at that confidence (the only relaxation allowed); 4e-6 in all.
    sigma = classic_sigma(epsilon, DELTA)
    exact = voting_epsilon_exact(sigma, DELTA)
    result = bootstrap_voting_audit(
        CLEAN_WITH,
        CLEAN_WITHOUT,
        sigma,
        400_000,
        positive_index=0,
        negative_index=1,
        delta=DELTA,
        confidence=0.95,
        rng=np.random.default_rng(1000 + int(epsilon)),
    )
    white = result.white_box
    assert white.epsilon_lower >= 0.9 * exact
    strict = estimate_from_counts(
        white.tp, white.fn, white.fp, white.tn, delta=DELTA, confidence=UPPER_CONFIDENCE
    )
    assert strict.epsilon_lower <= exact
    assert result.n_sample == 400_000
    assert result.llm_calls == 2
    assert white.tp + white.fn == 360_000  # default selection fraction 0.1


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_positive_control_noise_four_times_too_small(epsilon: float) -> None:
    # A server that adds a quarter of the configured noise leaks mu 4x larger than claimed;
    # the audit must report epsilon_lower above the configured epsilon. Over 10 seeds per
    # case the held-out bound was >= 0.97 epsilon_exact, and epsilon_exact is 3.5x to 6x the
    # configured epsilon here: failure needs a > 60% shortfall, dozens of sd away (nil).
    sigma = classic_sigma(epsilon, DELTA) / 4
    result = bootstrap_voting_audit(
        CLEAN_WITH,
        CLEAN_WITHOUT,
        sigma,
        400_000,
        positive_index=0,
        negative_index=1,
        delta=DELTA,
        rng=np.random.default_rng(2000 + int(epsilon)),
    )
    assert result.white_box.epsilon_lower > epsilon


def test_bootstrap_result_serialises() -> None:
    result = bootstrap_voting_audit(
        np.array([[1, 9], [2, 8]]),
        CLEAN_WITHOUT,
        classic_sigma(2.0, DELTA),
        20_000,
        positive_index=0,
        negative_index=1,
        delta=DELTA,
        rng=np.random.default_rng(6),
        calls_per_row=T,
    )
    assert result.llm_calls == 3 * T
    data = json.loads(json.dumps(result.to_dict()))
    assert data["mechanism"] == "voting"
    assert set(data["black_box"]) >= {"mu_lower", "epsilon_lower", "epsilon_lower_classic"}
    assert "optimistic" in data["white_box"]


# ----------------------------------------------------------------------------- ESA


def _unit(v: np.ndarray) -> np.ndarray:
    return np.asarray(v / np.linalg.norm(v, axis=-1, keepdims=True), dtype=np.float64)


@pytest.mark.parametrize("d", [1, 2, 3, 24])
def test_esa_projection_matches_direct_simulation(d: int) -> None:
    # The 2-D projection + chi-square sampler against the plain d-dimensional simulation.
    # Two-sample KS tests at 1.25e-5 per world and dimension (8 tests): false-failure rate
    # <= 1e-4.
    rng = np.random.default_rng(10 + d)
    e_pos, e_neg = _unit(rng.normal(size=d)), _unit(rng.normal(size=d))
    emb_with = 0.6 * _unit(rng.normal(size=(5, d)))
    emb_without = 0.6 * _unit(rng.normal(size=(7, d)))
    sigma, n = 0.4, 20_000
    sim = simulate_esa(emb_with, emb_without, sigma, n, e_pos=e_pos, e_neg=e_neg, rng=rng)

    def direct(clean: np.ndarray) -> np.ndarray:
        m = clean[rng.integers(0, len(clean), n)] + sigma * rng.normal(size=(n, d))
        out: np.ndarray = np.linalg.norm(m - e_pos, axis=1) - np.linalg.norm(m - e_neg, axis=1)
        return out

    assert stats.ks_2samp(sim.scores_with, direct(emb_with)).pvalue > 1.25e-5
    assert stats.ks_2samp(sim.scores_without, direct(emb_without)).pvalue > 1.25e-5


def test_esa_identical_options_give_zero_scores() -> None:
    e = np.ones(4) / 2
    sim = simulate_esa(
        np.zeros((2, 4)),
        np.zeros((2, 4)),
        1.0,
        100,
        e_pos=e,
        e_neg=e,
        rng=np.random.default_rng(0),
    )
    np.testing.assert_array_equal(sim.scores_with, 0.0)


def test_bootstrap_esa_audit_bounds_and_tightness() -> None:
    # ESA with T = 10 partitions, one voting for the positive option: the clean means differ
    # by (e_pos - e_neg) / T. The distance-difference score is nearly (not exactly) the
    # optimal test. Over 40 seeds the held-out ratio to epsilon_exact was 0.93 +- 0.03:
    # the 0.75 floor is 6 sd away (nil). Upper check at UPPER_CONFIDENCE: <= 1e-6.
    rng = np.random.default_rng(12)
    d = 384
    e_pos, e_neg = _unit(rng.normal(size=d)), _unit(rng.normal(size=d))
    clean_with = ((e_pos + (T - 1) * e_neg) / T)[None, :]
    clean_without = e_neg[None, :]
    sigma = classic_sigma(1.0, DELTA, 2 / T)
    exact = esa_epsilon_exact(sigma, clean_with[0] - clean_without[0], DELTA)
    start = time.perf_counter()
    result = bootstrap_esa_audit(
        clean_with, clean_without, sigma, 400_000, e_pos=e_pos, e_neg=e_neg, delta=DELTA, rng=rng
    )
    elapsed = time.perf_counter() - start
    white = result.white_box
    assert white.positive_when == "below"
    assert white.epsilon_lower >= 0.75 * exact
    strict = estimate_from_counts(
        white.tp, white.fn, white.fp, white.tn, delta=DELTA, confidence=UPPER_CONFIDENCE
    )
    assert strict.epsilon_lower <= exact
    assert result.mechanism == "esa"
    assert elapsed < 10.0  # d = 384 costs no more than d = 2 (smoke check)


# ----------------------------------------------------------------------------- independence


def test_auditor_math_never_imports_the_server() -> None:
    code = (
        "import sys, dpicl_audit.estimators.bootstrap, dpicl_audit.estimators, "
        "dpicl_audit.mechanisms.voting.bootstrap, dpicl_audit.mechanisms.esa.simulation; "
        "print(any(m == 'dpicl' or m.startswith('dpicl.') for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"
