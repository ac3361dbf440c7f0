"""DPS-MOZO mechanism (paper 004, Algorithm 1): divergences, lambda search, sampling."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import stats
from scipy.special import softmax

from dpicl.errors import ConfigurationError
from dpicl.mechanisms.dps_mozo.diagnostics import exact_shot_divergence, product_divergence
from dpicl.mechanisms.dps_mozo.release import (
    MozoStep,
    log_softmax,
    mixed_logits,
    mozo_step,
    product_distribution,
    renyi_divergence,
    sample_shots,
    sample_token,
    solve_lambdas,
    symmetric_divergence,
)

# Chi-square tests below reject at p < 1e-4: with fresh randomness a correct sampler fails
# such a test with probability 1e-4 per test. The generators are seeded, so in CI each test
# is deterministic; the threshold states how unlucky a seed would have to be.
P_REJECT = 1e-4


def _direct_renyi(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    return float(np.log(np.sum(p**alpha * q ** (1 - alpha))) / (alpha - 1))


def _instance(
    seed: int, n_shots: int = 4, k: int = 50, scale: float = 3.0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    zero = rng.normal(size=k) * scale
    one = zero + rng.normal(size=(n_shots, k)) * scale * rng.uniform(0.05, 1.0, size=(n_shots, 1))
    return one, zero


# --------------------------------------------------------------------------- divergences


def test_renyi_divergence_matches_direct_formula() -> None:
    rng = np.random.default_rng(0)
    for alpha in (1.5, 2.0, 7.0, 30.0):
        a, b = rng.normal(size=8), rng.normal(size=8)
        expected = _direct_renyi(softmax(a), softmax(b), alpha)
        assert renyi_divergence(a, b, alpha) == pytest.approx(expected, rel=1e-10)
        # logits are unnormalised: shifting changes nothing
        assert renyi_divergence(a + 5.0, b - 3.0, alpha) == pytest.approx(expected, rel=1e-10)
        # probabilities as log-probabilities
        assert renyi_divergence(np.log(softmax(a)), np.log(softmax(b)), alpha) == pytest.approx(
            expected, rel=1e-10
        )


def test_renyi_divergence_vectorised_and_support() -> None:
    rng = np.random.default_rng(1)
    p = rng.normal(size=(3, 4, 6))
    q = rng.normal(size=(6,))
    out = renyi_divergence(p, q, 3.0)
    assert out.shape == (3, 4)
    for i, j in itertools.product(range(3), range(4)):
        assert out[i, j] == pytest.approx(_direct_renyi(softmax(p[i, j]), softmax(q), 3.0))
    assert renyi_divergence(q, q, 3.0) == 0.0
    # zero mass in P is ignored; mass where Q has none gives inf
    p0 = np.array([0.0, -np.inf, 1.0])
    q0 = np.array([0.0, 2.0, 1.0])
    expected = _direct_renyi(softmax([0.0, 1.0]), softmax(q0)[[0, 2]], 2.0)
    assert renyi_divergence(p0, q0, 2.0) == pytest.approx(
        math.log(np.sum(softmax([0.0, 1.0]) ** 2 / softmax(q0)[[0, 2]]))
    )
    assert expected > 0
    assert renyi_divergence(q0, p0, 2.0) == math.inf
    both = symmetric_divergence(p, q, 3.0)
    assert both.shape == (3, 4, 2)
    np.testing.assert_allclose(both[..., 1], renyi_divergence(q, p, 3.0))


@pytest.mark.parametrize("alpha", [1.0, 0.5, math.inf, math.nan])
def test_renyi_divergence_rejects_bad_order(alpha: float) -> None:
    with pytest.raises(ConfigurationError) as info:
        renyi_divergence([0.0, 1.0], [1.0, 0.0], alpha)
    assert info.value.param == "mechanism.alpha"


# --------------------------------------------------------------------------- lambdas


def _dense_scan(
    one_row: np.ndarray, zero: np.ndarray, beta: float, alpha: float, lam_max: float, step: float
) -> float:
    """Largest feasible lambda on a grid before the first violation."""
    grid = np.arange(0.0, lam_max + step / 2, step)
    mixed = zero[None, :] + grid[:, None] * (one_row - zero)[None, :]
    worst = symmetric_divergence(mixed, zero[None, :], alpha).max(axis=-1)
    bad = np.flatnonzero(worst > beta * alpha)
    if bad.size == 0:
        return float(grid[-1])
    return float(grid[bad[0] - 1])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("beta", "alpha"), [(0.081, 14), (0.179, 8), (0.445, 6), (0.01, 2.5)])
def test_lambdas_match_dense_scan(seed: int, beta: float, alpha: float) -> None:
    one, zero = _instance(seed, n_shots=5, k=40, scale=2.0 + seed)
    lambdas = solve_lambdas(one, zero, beta, alpha)
    assert lambdas.shape == (5,)
    for i in range(5):
        scan = _dense_scan(one[i], zero, beta, alpha, 1.5, 2e-4)
        assert lambdas[i] == pytest.approx(scan, abs=1e-3)
        assert scan <= lambdas[i] + 1e-12  # the scan is never beyond the bisection point


def test_constraint_holds_and_is_tight() -> None:
    beta, alpha = 0.05, 10.0
    for seed in range(20):
        one, zero = _instance(100 + seed, n_shots=4, k=100, scale=4.0)
        lambdas = solve_lambdas(one, zero, beta, alpha)
        div = symmetric_divergence(mixed_logits(one, zero, lambdas), zero, alpha)
        assert np.all(div <= beta * alpha)
        interior = lambdas < 1.5
        # tight where the bound is active: a slightly larger lambda violates it
        over = symmetric_divergence(mixed_logits(one, zero, lambdas + 1e-7), zero, alpha)
        assert np.all(over.max(axis=-1)[interior] > beta * alpha)


def test_lambda_edge_cases() -> None:
    rng = np.random.default_rng(3)
    zero = rng.normal(size=20)
    one = np.stack([zero, zero + 7.0, zero + rng.normal(size=20) * 10])
    lambdas = solve_lambdas(one, zero, 0.1, 4.0)
    # identical or shifted logits: the divergence is 0 everywhere, lam_max is feasible
    assert lambdas[0] == 1.5
    assert lambdas[1] == 1.5
    assert 0.0 < lambdas[2] < 1.5
    # beta = 0 leaves only lambda ~ 0 for a differing shot
    assert solve_lambdas(one, zero, 0.0, 4.0)[2] <= 1e-9
    # a tiny difference fits entirely
    assert solve_lambdas(zero[None, :] + 1e-6 * rng.normal(size=20), zero, 0.1, 4.0)[0] == 1.5
    # lam_max parameter
    assert solve_lambdas(one, zero, 0.1, 4.0, lam_max=1.0)[0] == 1.0
    assert solve_lambdas(one, zero, 0.1, 4.0, lam_max=0.0).tolist() == [0.0, 0.0, 0.0]
    # larger beta never gives a smaller lambda
    assert np.all(solve_lambdas(one, zero, 0.2, 4.0) >= lambdas)


@settings(max_examples=60, deadline=None)
@given(
    zero=hnp.arrays(np.float64, 6, elements=st.floats(-30, 30)),
    noise=hnp.arrays(np.float64, (2, 6), elements=st.floats(-30, 30)),
    log_beta=st.floats(-6, 1),
    alpha=st.floats(1.1, 40),
)
def test_lambda_feasible_and_maximal(
    zero: np.ndarray, noise: np.ndarray, log_beta: float, alpha: float
) -> None:
    beta = math.exp(log_beta)
    one = zero + noise
    lambdas = solve_lambdas(one, zero, beta, alpha)
    assert np.all((lambdas >= 0) & (lambdas <= 1.5))
    div = symmetric_divergence(mixed_logits(one, zero, lambdas), zero, alpha)
    assert np.all(div.max(axis=-1) <= beta * alpha)
    bigger = np.minimum(lambdas + 1e-6, 1.5)
    worse = symmetric_divergence(mixed_logits(one, zero, bigger), zero, alpha).max(axis=-1)
    assert np.all((lambdas == 1.5) | (worse > beta * alpha))


@settings(max_examples=40, deadline=None)
@given(
    zero=hnp.arrays(np.float64, 5, elements=st.floats(-20, 20)),
    diff=hnp.arrays(np.float64, 5, elements=st.floats(-20, 20)),
    alpha=st.floats(1.1, 50),
)
def test_divergence_monotone_in_lambda(zero: np.ndarray, diff: np.ndarray, alpha: float) -> None:
    """The module docstring's convexity argument: both directions grow with lambda >= 0."""
    grid = np.linspace(0.0, 1.5, 301)
    mixed = zero[None, :] + grid[:, None] * diff[None, :]
    div = symmetric_divergence(mixed, zero[None, :], alpha)
    steps = np.diff(div, axis=0)
    assert np.all(steps >= -1e-9 * (1.0 + div[1:]))


# --------------------------------------------------------------------------- mixing, product


def test_mixed_logits_and_product() -> None:
    one, zero = _instance(7, n_shots=3, k=9)
    lambdas = np.array([0.0, 1.0, 1.5])
    mixed = mixed_logits(one, zero, lambdas)
    np.testing.assert_array_equal(mixed[0], zero)
    np.testing.assert_allclose(mixed[1], one[1])
    np.testing.assert_allclose(mixed[2], 1.5 * one[2] - 0.5 * zero)
    probs = product_distribution(mixed)
    direct = np.prod(softmax(mixed, axis=-1), axis=0)
    np.testing.assert_allclose(probs, direct / direct.sum(), rtol=1e-12)
    assert probs.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(np.exp(log_softmax(mixed)).sum(axis=-1), 1.0)


# --------------------------------------------------------------------------- sampling


def test_sample_token_chi_square() -> None:
    rng = np.random.default_rng(2024)
    one, zero = _instance(11, n_shots=4, k=12, scale=1.0)
    probs = product_distribution(mixed_logits(one, zero, solve_lambdas(one, zero, 0.3, 5.0)))
    keep = probs > 1e-3
    probs = np.where(keep, probs, 0.0)  # also checks zero-mass entries are never drawn
    probs /= probs.sum()
    n = 30_000
    counts = np.bincount([sample_token(probs, rng) for _ in range(n)], minlength=probs.size)
    assert np.all(counts[~keep] == 0)
    expected = probs[keep] * n
    assert expected.min() >= 5
    result = stats.chisquare(counts[keep], expected)
    assert result.pvalue >= P_REJECT


def test_sample_token_edges() -> None:
    rng = np.random.default_rng(0)
    assert sample_token(np.array([0.0, 0.0, 1.0]), rng) == 2
    assert sample_token(np.array([2.0, 0.0]), rng) == 0  # unnormalised is fine
    for bad in ([], [0.0, 0.0], [-0.1, 1.1], [np.nan, 1.0]):
        with pytest.raises(ValueError, match="probs"):
            sample_token(np.array(bad), rng)


def test_sample_shots_without_replacement_and_uniform() -> None:
    """Every 3-subset of 6 exemplars equally likely (20 cells, chi-square)."""
    rng = np.random.default_rng(99)
    n, m, draws = 6, 3, 20_000
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(n), m))}
    counts = np.zeros(len(subsets), dtype=np.int64)
    for _ in range(draws):
        shots = sample_shots(n, m, rng)
        assert shots.dtype == np.int64
        assert len(set(shots.tolist())) == m
        counts[subsets[tuple(sorted(shots.tolist()))]] += 1
    assert stats.chisquare(counts).pvalue >= P_REJECT


def test_sample_shots_bounds() -> None:
    rng = np.random.default_rng(1)
    assert sorted(sample_shots(5, 5, rng).tolist()) == [0, 1, 2, 3, 4]
    for n_ex, n_shots in ((3, 4), (3, 0), (3, -1)):
        with pytest.raises(ConfigurationError) as info:
            sample_shots(n_ex, n_shots, rng)
        assert info.value.param == "mechanism.n_shots"
        assert str(n_shots) in info.value.message


# --------------------------------------------------------------------------- one step


def test_mozo_step() -> None:
    one, zero = _instance(5, n_shots=4, k=100)
    top_ids = np.arange(100, dtype=np.int64) * 7 + 3
    beta, alpha = 0.179, 8
    step = mozo_step(one, zero, top_ids, beta, alpha, np.random.default_rng(1))
    again = mozo_step(one, zero, top_ids, beta, alpha, np.random.default_rng(1))
    assert isinstance(step, MozoStep)
    assert step.token_id == again.token_id
    assert step.token_id in set(top_ids.tolist())
    assert step.lambdas.shape == (4,)
    assert step.divergences.shape == (4, 2)
    assert np.all(step.divergences <= beta * alpha)
    np.testing.assert_allclose(step.lambdas, solve_lambdas(one, zero, beta, alpha))
    mixed = mixed_logits(one, zero, step.lambdas)
    np.testing.assert_allclose(step.mixed_probs, softmax(mixed, axis=-1))
    np.testing.assert_allclose(step.product_probs, product_distribution(mixed))
    with pytest.raises(ValueError, match="top_ids"):
        mozo_step(one, zero, top_ids[:5], beta, alpha, np.random.default_rng(1))
    with pytest.raises(ValueError, match="shape"):
        mozo_step(one[:, :10], zero, top_ids, beta, alpha, np.random.default_rng(1))
    with pytest.raises(ConfigurationError) as info:
        mozo_step(one, zero, top_ids, -1.0, alpha, np.random.default_rng(1))
    assert info.value.param == "mechanism.beta"


@pytest.mark.parametrize("eps0", [None, 0.3])
def test_a_shot_whose_numerics_fail_is_answered_by_the_zero_shot_logits(
    eps0: float | None,
) -> None:
    """A shot with a NaN or inf on the support mixes to p0 exactly (q_i = p0, as an
    over-long shot prompt); the step answers and the other shots are untouched. Non-finite
    zero-shot logits (a public prompt) stay an error."""
    one, zero = _instance(9, n_shots=3, k=20)
    top_ids = np.arange(20, dtype=np.int64)
    broken = one.copy()
    broken[1, 7] = np.nan
    broken[2, 0] = np.inf
    fixed = one.copy()
    fixed[1] = zero
    fixed[2] = zero
    step = mozo_step(broken, zero, top_ids, 0.2, 4.0, np.random.default_rng(3), eps0=eps0)
    ref = mozo_step(fixed, zero, top_ids, 0.2, 4.0, np.random.default_rng(3), eps0=eps0)
    assert step.token_id == ref.token_id
    np.testing.assert_array_equal(step.mixed_probs, ref.mixed_probs)
    np.testing.assert_allclose(step.mixed_probs[1:], np.tile(step.zero_probs, (2, 1)))
    np.testing.assert_array_equal(step.lambdas[0], ref.lambdas[0])
    bad_zero = zero.copy()
    bad_zero[3] = np.nan
    with pytest.raises(ValueError, match="finite"):
        mozo_step(one, bad_zero, top_ids, 0.2, 4.0, np.random.default_rng(3), eps0=eps0)


def test_mozo_step_samples_product() -> None:
    """The token is drawn by sample_token from product_probs with the rng passed in (whose
    distribution test_sample_token_chi_square checks), and nothing else consumes randomness."""
    one, zero = _instance(8, n_shots=2, k=6, scale=1.0)
    top_ids = np.array([10, 11, 12, 13, 14, 15])
    for seed in range(50):
        step = mozo_step(one, zero, top_ids, 0.2, 4.0, np.random.default_rng(seed))
        position = sample_token(step.product_probs, np.random.default_rng(seed))
        assert step.token_id == top_ids[position]


# --------------------------------------------------------------------------- diagnostics


def test_exact_shot_divergence_brute_force() -> None:
    one, zero = _instance(9, n_shots=3, k=8)
    mixed = mixed_logits(one, zero, solve_lambdas(one, zero, 0.1, 5.0))
    out = exact_shot_divergence(mixed, zero, 5.0)
    assert out.shape == (3, 2)
    factors = softmax(mixed, axis=-1)
    p = np.prod(factors, axis=0)
    p /= p.sum()
    for i in range(3):
        swapped = factors.copy()
        swapped[i] = softmax(zero)
        r = np.prod(swapped, axis=0)
        r /= r.sum()
        assert out[i, 0] == pytest.approx(_direct_renyi(p, r, 5.0), rel=1e-8, abs=1e-14)
        assert out[i, 1] == pytest.approx(_direct_renyi(r, p, 5.0), rel=1e-8, abs=1e-14)


def test_exact_shot_divergence_single_shot_is_the_mixing_bound() -> None:
    """With one shot the neighbour is the zero-shot distribution itself."""
    one, zero = _instance(4, n_shots=1, k=30)
    mixed = mixed_logits(one, zero, solve_lambdas(one, zero, 0.05, 6.0))
    np.testing.assert_allclose(
        exact_shot_divergence(mixed, zero, 6.0)[0],
        symmetric_divergence(mixed[0], zero, 6.0),
        rtol=1e-9,
    )


def test_theorem_b3_counterexample() -> None:
    """Documents a finding: Theorem B.3's per-token bound 4*beta*alpha does not hold.

    One shot (n_shots = 1), two tokens, alpha = 2, beta = 0.05 (radius 0.1, claimed bound
    0.4). Neighbouring contexts differ in the sampled exemplar: A's one-shot logits (0, -10),
    B's (0, -40); zero-shot logits (0, -20). Each mixed distribution is inside the radius-0.1
    ball around the zero-shot distribution in both directions, as Algorithm 1 requires, yet
    D_2(P_A || P_B) is about 15.5. The triangle-like inequality (Theorem B.1, Steinke's
    Lemma 33.7) needs the bounds D_gamma <= eps * gamma at *every* order gamma (zCDP-style);
    Line 13 enforces them at the single order alpha only.
    """
    beta, alpha = 0.05, 2.0
    zero = np.array([0.0, -20.0])
    one = np.array([[0.0, -10.0], [0.0, -40.0]])
    lambdas = solve_lambdas(one, zero, beta, alpha)
    mixed = mixed_logits(one, zero, lambdas)
    assert np.all(symmetric_divergence(mixed, zero, alpha) <= beta * alpha)
    d = product_divergence(mixed[:1], mixed[1:], alpha)
    assert d[0] > 15.0 > 4 * beta * alpha
    # the same by hand, from probabilities
    p_a, p_b = softmax(mixed[0]), softmax(mixed[1])
    assert _direct_renyi(p_a, p_b, alpha) == pytest.approx(d[0], rel=1e-6)


def test_product_divergence_shapes() -> None:
    one, zero = _instance(2, n_shots=3, k=10)
    mixed = mixed_logits(one, zero, solve_lambdas(one, zero, 0.1, 4.0))
    out = product_divergence(mixed, mixed, 4.0)
    assert out.shape == (2,)
    np.testing.assert_allclose(out, 0.0, atol=1e-15)
