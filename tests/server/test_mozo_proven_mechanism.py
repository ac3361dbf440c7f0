"""DPS-MOZO's proven mode: the max-log-ratio lambda search and the per-token bound.

Evidence for docs/privacy.md: every mixed distribution stays within eps0 of the zero-shot
one, and the realised worst-case log-ratio between the released distributions of
neighbouring shot sets never exceeds the per-token bound (4 eps0, 2 eps0 with one shot) on
adversarial logits (the docs' counterexamples), generated logits (hypothesis) and real
SmolLM2 logits. Also: the paper's constraint enforced at *every* Renyi order is not enough
with two shots (a pinned counterexample).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import logsumexp

from dpicl.mechanisms.dps_mozo.diagnostics import exact_shot_log_ratio
from dpicl.mechanisms.dps_mozo.proven import per_token_epsilon
from dpicl.mechanisms.dps_mozo.release import (
    log_softmax,
    max_log_ratio,
    mixed_logits,
    mozo_step,
    product_distribution,
    renyi_divergence,
    sample_shots,
    solve_lambdas_max_ratio,
)

FloatArray = npt.NDArray[np.float64]
TOL = 1e-9


def released_log(one: FloatArray, zero: FloatArray, eps0: float) -> tuple[FloatArray, FloatArray]:
    """(log of the released product distribution, each shot's radius) in the proven mode."""
    lam = solve_lambdas_max_ratio(one, zero, eps0)
    mixed = mixed_logits(one, zero, lam)
    radius = max_log_ratio(log_softmax(mixed), log_softmax(zero))
    return np.log(product_distribution(mixed)), radius


def worst_neighbour_ratio(
    one: FloatArray, other: FloatArray, zero: FloatArray, eps0: float
) -> float:
    """max over replaced shots i of max_y |log P(y) - log P'(y)|, P' with shot i's logits
    replaced by ``other``."""
    log_p, _ = released_log(one, zero, eps0)
    worst = 0.0
    for i in range(one.shape[0]):
        alt = one.copy()
        alt[i] = other
        log_q, _ = released_log(alt, zero, eps0)
        worst = max(worst, float(np.max(np.abs(log_p - log_q))))
    return worst


def test_solver_is_feasible_and_maximal() -> None:
    rng = np.random.default_rng(3)
    for _ in range(60):
        k = int(rng.integers(2, 40))
        zero = rng.normal(0, 8, k)
        one = zero + rng.normal(0, 4, (3, k))
        eps0 = float(rng.uniform(0.01, 1.0))
        lam = solve_lambdas_max_ratio(one, zero, eps0, lam_max=1.5)
        radius = max_log_ratio(log_softmax(mixed_logits(one, zero, lam)), log_softmax(zero))
        assert np.all(radius <= eps0)
        # A dense scan agrees: the largest feasible grid point is within one grid step.
        grid = np.linspace(0.0, 1.5, 1501)
        for s in range(3):
            r = max_log_ratio(
                log_softmax(zero[None, :] + grid[:, None] * (one[s] - zero)[None, :]),
                log_softmax(zero)[None, :],
            )
            assert np.all(np.diff(r) >= -1e-12)  # monotone in lambda (docstring proof)
            best = grid[r <= eps0 * (1 - 1e-9)].max()
            assert best - 1e-12 <= lam[s] <= best + 1.5 / 1500


def test_solver_edges() -> None:
    zero = np.array([0.0, -1.0, -2.0])
    one = np.array([[0.0, -1.0, -2.0], [5.0, 0.0, -9.0]])
    lam = solve_lambdas_max_ratio(one, zero, 0.0)
    assert lam[1] < 1e-12  # zero up to rounding (the constraint forces q = p0)
    lam = solve_lambdas_max_ratio(one, zero, 50.0, lam_max=1.5)
    assert np.all(lam == 1.5)
    with pytest.raises(Exception, match="max_log_ratio"):
        solve_lambdas_max_ratio(one, zero, -1.0)


@pytest.mark.parametrize("gap", [10.0, 20.0, 40.0, 80.0])
def test_docs_one_shot_counterexample_is_bounded(gap: float) -> None:
    # docs/privacy.md: zero-shot (0, -L), neighbouring one-shot logits (0, -10) and (0, -40).
    # The paper's constraint lets D_2 grow with L; the proven mode keeps the pure bound.
    zero = np.array([0.0, -gap])
    a, b = np.array([[0.0, -10.0]]), np.array([[0.0, -40.0]])
    eps0 = 0.1
    log_p, ra = released_log(a, zero, eps0)
    log_q, rb = released_log(b, zero, eps0)
    assert ra[0] <= eps0 and rb[0] <= eps0
    bound = per_token_epsilon(eps0, 1)
    assert float(np.max(np.abs(log_p - log_q))) <= bound + TOL
    # Max-divergence bounds every Renyi divergence, so D_2 is bounded too.
    assert float(renyi_divergence(log_p, log_q, 2.0)) <= bound + TOL


def every_order_lambda(zero: FloatArray, d: FloatArray, beta: float) -> float:
    """Largest t (bisection) with D_g(q_t || p0) <= beta g and D_g(p0 || q_t) <= beta g on a
    fine grid of orders g in (1, 10^4], q_t ∝ p0 e^{t d}."""
    g = np.concatenate([1 + np.geomspace(1e-4, 1, 400), np.geomspace(2, 1e4, 800)])[:, None]
    lp0 = log_softmax(zero)

    def ok(t: float) -> bool:
        lq = log_softmax(zero + t * d)
        fwd = logsumexp(g * lq + (1 - g) * lp0, axis=1) / (g[:, 0] - 1)
        bwd = logsumexp(g * lp0 + (1 - g) * lq, axis=1) / (g[:, 0] - 1)
        return bool(np.all(np.maximum(fwd, bwd) <= beta * g[:, 0]))

    lo, hi = 0.0, 50.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return 0.999 * lo  # strictly inside the feasible set


def test_every_order_repair_fails_with_two_shots() -> None:
    # Found by random search plus hill climbing (3 tokens, alpha = 2, beta = 0.05): both
    # shots' mixed distributions satisfy D_g <= beta g at every order g in both directions,
    # yet the released products of two neighbouring shot sets are further apart than the
    # claimed 4 beta alpha = 0.4 at alpha = 2.
    zero = np.array([1.0516, -0.181, 0.5905])
    d1 = np.array([-0.2571, 0.1983, 0.8349])
    d1_neighbour = np.array([0.0687, -0.4974, -1.147])
    d2 = np.array([-0.1377, -1.1604, 0.8034])
    beta, alpha = 0.05, 2.0
    q = [log_softmax(zero + every_order_lambda(zero, d, beta) * d) for d in (d1, d1_neighbour, d2)]
    p = log_softmax(q[0] + q[2])
    p_neighbour = log_softmax(q[1] + q[2])
    worst = max(
        float(renyi_divergence(p, p_neighbour, alpha)),
        float(renyi_divergence(p_neighbour, p, alpha)),
    )
    assert worst > 1.05 * 4 * beta * alpha


logit_rows = arrays(
    np.float64,
    st.tuples(st.integers(1, 5), st.integers(2, 24)),
    elements=st.floats(-60, 60, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=150, deadline=None)
@given(
    one=logit_rows,
    data=st.data(),
    eps0=st.floats(1e-3, 2.0),
)
def test_property_released_distribution_within_per_token_bound(
    one: FloatArray, data: st.DataObject, eps0: float
) -> None:
    n, k = one.shape
    row = arrays(np.float64, (k,), elements=st.floats(-60, 60, allow_nan=False))
    zero = data.draw(row)
    other = data.draw(row)
    step = mozo_step(one, zero, np.arange(k), None, None, np.random.default_rng(0), eps0=eps0)
    # The constraint holds on the released (reported) probabilities themselves.
    assert np.all(max_log_ratio(np.log(step.mixed_probs), np.log(step.zero_probs)) <= eps0 + TOL)
    assert np.all(step.log_ratios <= eps0)
    mixed = mixed_logits(one, zero, step.lambdas)
    assert np.all(exact_shot_log_ratio(mixed, zero) <= 2 * eps0 + TOL)
    assert worst_neighbour_ratio(one, other, zero, eps0) <= per_token_epsilon(eps0, n) + TOL


# ------------------------------------------------------------------ real SmolLM2 logits

CACHE_DIR = Path(os.environ.get("DPICL_CACHE_DIR", str(Path.home() / ".cache" / "dpicl")))


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    from dpicl.engines.models import resolve_llm
    from dpicl.engines.transformers.engine import TransformersEngine

    eng = TransformersEngine.load(resolve_llm(None, CACHE_DIR))
    yield eng
    asyncio.run(eng.aclose())


@pytest.mark.slow
async def test_real_smollm2_tokens_respect_the_bound(engine: object) -> None:
    from dpicl.engines.base import Exemplar
    from dpicl.prompts import render

    template = "Summarise the dialogue in one sentence.\n\n{exemplars}\n\nInput: {query}\nOutput:"
    exemplars = [
        Exemplar("A: Where are my keys? B: On the kitchen table.", "Someone finds the keys."),
        Exemplar("A: Is the shop open? B: Until nine tonight.", "The shop is open late."),
        Exemplar("A: Did you call mum? B: Yes, she is fine.", "Mum is fine."),
        Exemplar("A: The train is late. B: Let's take a taxi.", "They take a taxi."),
        Exemplar("A: I forgot my password. B: Use the reset link.", "Password reset advice."),
    ]
    query = "A: Are the concert tickets sold out? B: Yes, in ten minutes."
    prompts = [render(template, [e], query, task="generation") for e in exemplars]
    prompts.append(render(template, [], query, task="generation"))
    n_d = len(exemplars)
    rng = np.random.default_rng(11)
    session = await engine.open_decoding(prompts, zero_shot_index=n_d, top_k=50)  # type: ignore[attr-defined]
    checked = 0
    try:
        for eps0, n_shots in ((0.05, 3), (0.5, 3), (2.0, 1), (0.3, 5)):
            for _ in range(3):
                step = await session.step()
                shots = sample_shots(n_d, n_shots, rng)
                one, zero = step.logits[shots], step.logits[n_d]
                out = mozo_step(one, zero, step.top_ids, None, None, rng, eps0=eps0)
                ratios = max_log_ratio(np.log(out.mixed_probs), np.log(out.zero_probs))
                assert np.all(ratios <= eps0 + TOL)
                # Every other exemplar's real one-shot logits as the replacement.
                bound = per_token_epsilon(eps0, n_shots)
                for j in range(n_d):
                    worst = worst_neighbour_ratio(one, step.logits[j], zero, eps0)
                    assert worst <= bound + TOL
                checked += 1
                await session.advance(out.token_id)
    finally:
        await session.aclose()
    assert checked == 12
