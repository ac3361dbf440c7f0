"""The vLLM engine (CPU build) on the bundled SmolLM2, against the transformers engine on
the same converted model directory. Both run float32; the tolerances below cover the
different attention kernels (vLLM's CPU paged attention against torch SDPA)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpicl.engines.base import DecodingSession, Engine, GenerationParams, PromptSpec
from dpicl.engines.vllm.options import cache_salt
from dpicl.errors import InvalidRequest
from tests.vllm.conftest import needs_vllm

pytestmark = [needs_vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

SENTIMENT = (
    "Classify the sentiment of the review as positive or negative.\n\nReview: {q}\nSentiment:"
)
REVIEWS = [
    "I loved this movie, it was wonderful.",
    "Terrible acting and a stupid plot.",
    "An absolute delight from start to finish.",
    "What a dreadful, depressing mess.",
]
# Log-probabilities agree to this (nats); float32 kernels differ in summation order.
SCORE_ATOL = 2e-3


def prompt(q: str, scope: str = "ctx_test") -> PromptSpec:
    return PromptSpec(text=SENTIMENT.format(q=q), query=q, cache_scope=scope)


async def test_is_an_engine(vllm_engine: Any) -> None:
    assert isinstance(vllm_engine, Engine)
    assert vllm_engine.name == "vllm" and not vllm_engine.is_simulator


async def test_label_scores_match_transformers(vllm_engine: Any, hf_engine: Any) -> None:
    prompts = [prompt(q) for q in REVIEWS]
    # One single-token label pair and multi-token labels (chained requests on the cache).
    labels = ["positive", "negative", "very positive", "rather negative indeed"]
    assert any(
        len(vllm_engine.encoder.label_ids(vllm_engine.encoder.render(prompts[0]), lab)) > 2
        for lab in labels
    )
    got = await vllm_engine.score_labels(prompts, labels)
    want = await hf_engine.score_labels(prompts, labels)
    assert got.shape == (4, 4)
    np.testing.assert_allclose(got, want, atol=SCORE_ATOL, rtol=0)
    assert np.all(got < 0)
    # The model is not indifferent: the review decides the preferred label.
    assert got[0, 0] > got[0, 1] and got[1, 1] > got[1, 0]


async def test_bad_scoring_input_is_a_4xx(vllm_engine: Any) -> None:
    with pytest.raises(InvalidRequest):
        await vllm_engine.score_labels([prompt("x")], [])
    long = PromptSpec(text="word " * 5000, query="q")
    with pytest.raises(InvalidRequest, match="tokens"):
        await vllm_engine.score_labels([long], ["a"])


async def test_greedy_generation_matches_transformers(vllm_engine: Any, hf_engine: Any) -> None:
    prompts = [
        PromptSpec(text="Write one short sentence about the sea.", query="sea"),
        PromptSpec(text="Name three colours.", query="colours"),
    ]
    params = GenerationParams(max_tokens=12, temperature=0.0)
    got = await vllm_engine.generate(prompts, params)
    want = await hf_engine.generate(prompts, params)
    assert got == want
    assert all(t for t in got)


async def test_sampling_seed_per_prompt(vllm_engine: Any) -> None:
    # ESA sends T_cand identical zero-shot prompts in one call: they must not share a seed.
    same = [PromptSpec(text="Tell me a story about a cat.", query="cat")] * 4
    params = GenerationParams(max_tokens=16, temperature=1.0, seed=12345)
    a = await vllm_engine.generate(same, params)
    b = await vllm_engine.generate(same, params)
    assert a == b  # the engine's seed is reproducible (it is not DP noise)...
    assert len(set(a)) > 1  # ...and differs per prompt
    stop = await vllm_engine.generate(
        [PromptSpec(text="Count: 1, 2, 3, 4, 5, 6, 7", query="c")],
        GenerationParams(max_tokens=20, temperature=0.0, stop=(",",)),
    )
    assert "," not in stop[0]


async def _steps(session: DecodingSession, tokens: list[int]) -> list[Any]:
    out = []
    for tok in tokens:
        step = await session.step()
        out.append(step)
        await session.advance(int(step.top_ids[tok]))
    return out


@pytest.mark.parametrize(("top_k", "wide"), [(20, None), (150, None), (20, 20)])
async def test_decoding_matches_transformers_kv_loop(
    vllm_engine: Any, hf_engine: Any, top_k: int, wide: int | None
) -> None:
    one_shot = [
        PromptSpec(text=f"Example: {r}\nNow summarise the review: {REVIEWS[0]}", query="q")
        for r in REVIEWS[1:]
    ]
    zero = PromptSpec(text=f"Summarise the review: {REVIEWS[0]}", query="q")
    prompts = [*one_shot, zero]
    # Externally chosen tokens: not the argmax (rank 2, 1, 3, ...), so a session that
    # appended its own sampled token instead would drift apart at once.
    choice = [1, 0, 2, 1, 0, 3]
    v = await vllm_engine.open_decoding(prompts, zero_shot_index=3, top_k=top_k)
    if wide is not None:
        # Each one-shot row reports only its own top-k first, so the zero-shot ids it lacks
        # come from the second round (logprob_token_ids): both paths must agree.
        v.wide = wide
    h = await hf_engine.open_decoding(prompts, zero_shot_index=3, top_k=top_k)
    assert isinstance(v, DecodingSession)
    vs, hs = await _steps(v, choice), await _steps(h, choice)
    for a, b in zip(vs, hs, strict=True):
        assert a.logits.shape == (4, top_k)
        # Same top-k set; equal order except, at most, near-ties.
        assert set(a.top_ids.tolist()) == set(b.top_ids.tolist())
        order = {t: i for i, t in enumerate(b.top_ids.tolist())}
        idx = [order[t] for t in a.top_ids.tolist()]
        hb = b.logits[:, idx]
        # vLLM rows are raw logits minus the row's log-normaliser: equal after centring.
        da = a.logits - a.logits.mean(axis=1, keepdims=True)
        db = hb - hb.mean(axis=1, keepdims=True)
        np.testing.assert_allclose(da, db, atol=5e-3, rtol=0)
        assert np.all(np.diff(a.logits[3]) <= 0)  # the zero-shot row comes sorted
    assert v.decode([int(s.top_ids[c]) for s, c in zip(vs, choice, strict=True)]) == h.decode(
        [int(s.top_ids[c]) for s, c in zip(hs, choice, strict=True)]
    )
    await v.aclose()
    await h.aclose()


async def test_decoding_rejects_bad_input(vllm_engine: Any) -> None:
    p = [PromptSpec(text="hi", query="hi")]
    with pytest.raises(InvalidRequest):
        await vllm_engine.open_decoding(p, zero_shot_index=1, top_k=5)
    with pytest.raises(InvalidRequest, match="top_k"):
        await vllm_engine.open_decoding(p, zero_shot_index=0, top_k=5000)
    s = await vllm_engine.open_decoding(p, zero_shot_index=0, top_k=5)
    with pytest.raises(InvalidRequest, match="vocabulary"):
        await s.advance(10**9)


async def test_prefix_cache_is_salted_per_context(vllm_engine: Any) -> None:
    from vllm import SamplingParams

    text = SENTIMENT.format(q="A long review that repeats itself. " * 12)
    ids = vllm_engine.encoder.encode(PromptSpec(text=text, query="q"))[1]
    secret = vllm_engine.options.salt_secret
    salt_a, salt_b = cache_salt(secret, "ctx_a"), cache_salt(secret, "ctx_b")
    assert salt_a != salt_b and salt_a == cache_salt(secret, "ctx_a")
    params = SamplingParams(max_tokens=1, temperature=0.0)
    first = await vllm_engine.request(ids, salt_a, params)
    again = await vllm_engine.request(ids, salt_a, params)
    other = await vllm_engine.request(ids, salt_b, params)
    block = vllm_engine.options.block_size
    assert (first.num_cached_tokens or 0) == 0
    # Same context: every full block of the prompt is read from the cache.
    assert again.num_cached_tokens >= (len(ids) - 1) // block * block > 0
    # Another context: nothing is shared, so nothing can be probed by timing.
    assert (other.num_cached_tokens or 0) == 0
    # Scopes come from PromptSpec.cache_scope; unscoped prompts get a fresh salt per call.
    scoped = vllm_engine.salt_for([prompt("x", "ctx_a"), prompt("y", "ctx_a")])
    assert scoped == [salt_a, salt_a]
    loose = [PromptSpec(text="t", query="t")] * 2
    s1, s2 = vllm_engine.salt_for(loose), vllm_engine.salt_for(loose)
    assert s1[0] == s1[1] and s1[0] != s2[0] and salt_a not in s1
