"""The model-free parts of the transformers engine's serving path: the prefix LRU, the
micro-batcher, the tuning settings and the prefix marks set by prompt rendering.
Hypothesis runs derandomized, so every test here is deterministic."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpicl.config import Settings
from dpicl.engines.base import Exemplar
from dpicl.engines.transformers.batching import MicroBatcher
from dpicl.engines.transformers.kv_layout import pack_layers
from dpicl.engines.transformers.prefix_cache import PrefixCache, PrefixEntry, prefix_fingerprint
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import InvalidRequest
from dpicl.prompts import render

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None)


def entry(n_tokens: int, layers: int = 2) -> PrefixEntry:
    kv = tuple(
        (torch.zeros(1, 2, n_tokens, 4), torch.zeros(1, 2, n_tokens, 4)) for _ in range(layers)
    )
    return PrefixEntry(tuple(range(n_tokens)), kv)


# --------------------------------------------------------------------- prefix cache


def test_entry_size_and_matching() -> None:
    e = entry(3)
    assert e.nbytes == 2 * 2 * (2 * 3 * 4) * 4  # layers x (K, V) x elements x float32
    assert e.matches([0, 1, 2, 9])
    assert not e.matches([0, 1, 2])  # nothing left for the query: no reuse
    assert not e.matches([0, 1, 3, 9])
    assert not e.matches([0, 1])


def test_a_packed_entry_is_one_tensor_counted_once() -> None:
    plain = entry(4)
    packed, layers = pack_layers(plain.layers)
    e = PrefixEntry(plain.ids, layers, packed)
    assert e.nbytes == plain.nbytes
    for (k, v), (k0, v0) in zip(e.layers, plain.layers, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)
        assert k.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()


def test_lru_keeps_within_its_byte_and_entry_budgets() -> None:
    size = entry(4).nbytes
    cache = PrefixCache(max_bytes=3 * size, max_entries=10)
    for i in range(5):
        cache.put((f"ctx{i}/0", "f"), entry(4))
        assert cache.nbytes <= cache.max_bytes
    assert [k for k, _ in cache.entries()] == [("ctx2/0", "f"), ("ctx3/0", "f"), ("ctx4/0", "f")]
    assert cache.stats.evictions == 2
    # A hit refreshes an entry: ctx2 survives the next insertion, ctx3 goes.
    assert cache.get(("ctx2/0", "f")) is not None
    cache.put(("ctx5/0", "f"), entry(4))
    assert [k for k, _ in cache.entries()] == [("ctx4/0", "f"), ("ctx2/0", "f"), ("ctx5/0", "f")]
    assert cache.get(("ctx3/0", "f")) is None
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    # Entry budget.
    few = PrefixCache(max_bytes=100 * size, max_entries=2)
    for i in range(4):
        few.put((f"c{i}", "f"), entry(4))
    assert len(few) == 2
    assert few.nbytes == 2 * size
    # Replacing a key does not count it twice.
    few.put(("c3", "f"), entry(4))
    assert few.nbytes == 2 * size


def test_an_entry_larger_than_the_budget_is_not_stored() -> None:
    cache = PrefixCache(max_bytes=entry(4).nbytes - 1)
    cache.put(("ctx/0", "f"), entry(4))
    assert len(cache) == 0
    assert cache.nbytes == 0
    assert not PrefixCache(max_bytes=0).enabled
    with pytest.raises(ValueError, match="max_entries"):
        PrefixCache(max_bytes=10, max_entries=0)


def test_fingerprint_tells_texts_apart() -> None:
    assert prefix_fingerprint("abc") == prefix_fingerprint("abc")
    assert prefix_fingerprint("abc") != prefix_fingerprint("abd")
    assert len(prefix_fingerprint("\udcff")) == 64  # lone surrogates do not crash it


# --------------------------------------------------------------------- tuning settings


def test_tuning_from_settings_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPICL_PREFIX_CACHE_MIB", "7")
    monkeypatch.setenv("DPICL_BATCH_WAIT_MS", "0.5")
    monkeypatch.setenv("DPICL_BATCH_MAX_PROMPTS", "32")
    monkeypatch.setenv("DPICL_KV_WORKSPACE_MIB", "3")
    tuning = EngineTuning.from_settings(Settings())
    assert tuning == EngineTuning(
        prefix_cache_mib=7, kv_workspace_mib=3, batch_wait_ms=0.5, batch_max_prompts=32
    )
    assert tuning.prefix_cache_bytes == 7 * 2**20
    assert tuning.kv_workspace_bytes == 3 * 2**20
    with pytest.raises(ValueError, match="batch_max_prompts must be >= 1, got 0"):
        EngineTuning(batch_max_prompts=0)
    with pytest.raises(ValueError, match="batch_wait_ms"):
        EngineTuning(batch_wait_ms=-1)
    with pytest.raises(ValueError, match="prefix_cache_mib"):
        EngineTuning(prefix_cache_mib=-1)
    with pytest.raises(ValueError, match="kv_workspace_mib must be >= 0, got -2"):
        EngineTuning(kv_workspace_mib=-2)
    monkeypatch.setenv("DPICL_SHARED_PREFIX", "off")
    monkeypatch.setenv("DPICL_ENGINE_OVERLAP", "on")
    tuning = EngineTuning.from_settings(Settings())
    assert (tuning.shared_prefix, tuning.overlap) == ("off", "on")
    assert tuning.overlaps("cpu") and not tuning.shares_prefix_attention("cpu", 192)
    assert EngineTuning().overlaps("cuda") and not EngineTuning().overlaps("cpu")
    with pytest.raises(ValueError, match="overlap must be auto, on or off, got 'x'"):
        EngineTuning(overlap="x")  # type: ignore[arg-type]


# --------------------------------------------------------------------- micro-batcher


class Recorder:
    """A batch runner that doubles numbers; a negative number is a per-job error and a
    job of 999 makes the whole run fail."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    async def __call__(self, jobs: list[int]) -> list[int | BaseException]:
        self.batches.append(list(jobs))
        await asyncio.sleep(0.01)
        if 999 in jobs:
            raise RuntimeError("the model failed")
        return [InvalidRequest(f"bad job {j}") if j < 0 else 2 * j for j in jobs]


async def test_concurrent_jobs_share_a_batch_and_get_their_own_results() -> None:
    run = Recorder()
    batcher: MicroBatcher[int, int] = MicroBatcher(run, max_wait_s=0.005, max_size=100)
    results = await asyncio.gather(*[batcher.submit(i) for i in range(20)])
    assert results == [2 * i for i in range(20)]
    assert run.batches == [list(range(20))]


async def test_max_size_splits_batches_and_a_big_job_runs_alone() -> None:
    run = Recorder()
    batcher: MicroBatcher[int, int] = MicroBatcher(run, max_wait_s=0.0, max_size=4)
    sizes = [1, 2, 1, 1, 9, 1]
    results = await asyncio.gather(*[batcher.submit(i, size=s) for i, s in enumerate(sizes)])
    assert results == [0, 2, 4, 6, 8, 10]
    assert run.batches == [[0, 1, 2], [3], [4], [5]]
    assert batcher.batch_sizes == [3, 1, 1, 1]


async def test_requests_arriving_during_a_run_join_the_next_batch() -> None:
    run = Recorder()
    batcher: MicroBatcher[int, int] = MicroBatcher(run, max_wait_s=0.0, max_size=100)
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.002)  # the first batch is running now
    later = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 6)]
    assert await first == 0
    assert [await f for f in later] == [2, 4, 6, 8, 10]
    assert run.batches == [[0], [1, 2, 3, 4, 5]]


async def test_errors_reach_only_their_own_job() -> None:
    run = Recorder()
    batcher: MicroBatcher[int, int] = MicroBatcher(run, max_wait_s=0.002, max_size=100)
    results = await asyncio.gather(*[batcher.submit(i) for i in (1, -2, 3)], return_exceptions=True)
    assert results[0] == 2
    assert isinstance(results[1], InvalidRequest)
    assert "bad job -2" in str(results[1])
    assert results[2] == 6
    # A failure of the whole run reaches every job of that batch, and the next batch runs.
    failed = await asyncio.gather(*[batcher.submit(i) for i in (5, 999)], return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in failed)
    assert await batcher.submit(4) == 8


async def test_a_cancelled_request_never_reaches_the_engine() -> None:
    run = Recorder()
    batcher: MicroBatcher[int, int] = MicroBatcher(run, max_wait_s=0.05, max_size=100)
    doomed = asyncio.ensure_future(batcher.submit(7))
    kept = asyncio.ensure_future(batcher.submit(8))
    await asyncio.sleep(0)
    doomed.cancel()
    assert await kept == 16
    assert run.batches == [[8]]


class Launcher(Recorder):
    """:class:`Recorder` as a launch: the run starts now, its results are read back later;
    ``log`` records the order of launches and read-backs."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    async def launch(self, jobs: list[int]) -> Any:
        self.log.append(f"launch {jobs}")
        results = await self(jobs)

        async def collect() -> list[int | BaseException]:
            self.log.append(f"collect {jobs}")
            return results

        return collect


async def test_overlap_launches_the_next_batch_before_reading_the_last_back() -> None:
    run = Launcher()
    batcher: MicroBatcher[int, int] = MicroBatcher(
        run, max_wait_s=0.0, max_size=100, launch=run.launch
    )
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.002)  # the first batch is running now
    later = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 4)]
    results = await asyncio.gather(first, *later, batcher.submit(-5), return_exceptions=True)
    assert results[:4] == [0, 2, 4, 6]
    assert isinstance(results[4], InvalidRequest)  # an error still reaches its job only
    assert run.log == [
        "launch [0]",
        "launch [1, 2, 3, -5]",
        "collect [0]",
        "collect [1, 2, 3, -5]",
    ]
    # Alone, a batch is read back at once.
    assert await batcher.submit(5) == 10
    assert run.log[-2:] == ["launch [5]", "collect [5]"]


async def test_overlap_keeps_cancellation_and_whole_batch_failures() -> None:
    run = Launcher()
    batcher: MicroBatcher[int, int] = MicroBatcher(
        run, max_wait_s=0.0, max_size=100, launch=run.launch
    )
    first = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.002)
    doomed = asyncio.ensure_future(batcher.submit(7))
    kept = asyncio.ensure_future(batcher.submit(8))
    await asyncio.sleep(0)
    doomed.cancel()  # still waiting behind the running batch: never reaches the engine
    assert (await first, await kept) == (2, 16)
    assert run.batches == [[1], [8]]
    failed = await asyncio.gather(*[batcher.submit(i) for i in (5, 999)], return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in failed)
    assert await batcher.submit(4) == 8


def test_batcher_serves_one_event_loop_after_another() -> None:
    run = Recorder()
    batcher: MicroBatcher[int, int] = MicroBatcher(run, max_wait_s=0.0, max_size=8)
    assert asyncio.run(batcher.submit(1)) == 2
    assert asyncio.run(batcher.submit(2)) == 4
    with pytest.raises(ValueError, match="max_size"):
        MicroBatcher(run, max_wait_s=0.0, max_size=0)


# --------------------------------------------------------------------- prefix marks


words = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)


@SETTINGS
@given(
    head=words,
    tail=words,
    pairs=st.lists(st.tuples(words, words), max_size=3),
    q1=words,
    q2=words,
)
def test_the_marked_prefix_does_not_depend_on_the_query(
    head: str, tail: str, pairs: list[tuple[str, str]], q1: str, q2: str
) -> None:
    template = f"{head}{{exemplars}}|{{labels}}|{{query}}{tail}{{query}}"
    exemplars = [Exemplar(i, o) for i, o in pairs]
    a = render(template, exemplars, q1, task="classification", labels=["A", "B"])
    b = render(template, exemplars, q2, task="classification", labels=["A", "B"])
    assert a.prefix_text == b.prefix_text
    assert a.text.startswith(a.prefix_text)
    assert b.text.startswith(b.prefix_text)
    # The prefix is everything up to the query slot, whatever the exemplars hold.
    assert a.text[a.prefix_chars :].startswith(q1)


def test_slot_names_inside_user_text_are_never_filled() -> None:
    # Slot after slot, "{query}" in an exemplar received the query (the oracle then found
    # every query among the demonstrations) and "{exemplars}" in a label received every
    # exemplar, once per label.
    exemplars = [Exemplar("{query} {labels}", "{exemplars}")]
    labels = ["{exemplars}", "{query}"]
    p = render("{labels}|{exemplars}|{query}", exemplars, "Q", task="classification", labels=labels)
    assert p.text == "{exemplars}, {query}|Input: {query} {labels}\nLabel: {exemplars}|Q"
    assert p.text[p.prefix_chars :] == "Q"
    assert p.instructions == "{exemplars}, {query}||"


def test_the_default_template_prefix_ends_before_the_query() -> None:
    from dpicl.domain import DEFAULT_TEMPLATES

    p = render(
        DEFAULT_TEMPLATES["classification"],
        [Exemplar("a b", "Yes")],
        "the query",
        task="classification",
        labels=["Yes", "No"],
    )
    assert p.prefix_text.endswith("Input: ")
    assert p.text[p.prefix_chars :] == "the query\nLabel:"
    assert p.cache_key is None  # only the pipelines set it


async def test_callers_that_come_back_find_their_batch_whole() -> None:
    # Eight closed-loop callers: each sends its next job 1 ms after its last is answered.
    # Without waiting for them, the first batch's callers return while the second half is
    # already being taken, and batches alternate between halves. False-failure rate: only
    # if the event loop stalls for more than the 50 ms window (10% of a 0.5 s run).
    class Slow(Recorder):
        async def __call__(self, jobs: list[int]) -> list[int | BaseException]:
            await asyncio.sleep(0.49)
            return await super().__call__(jobs)

    run = Slow()
    batcher: MicroBatcher[int, int] = MicroBatcher(run, max_wait_s=0.001, max_size=100)

    async def caller(i: int) -> None:
        await asyncio.sleep(0.001 * i)  # staggered start: the first batch takes some only
        for k in range(3):
            assert await batcher.submit(10 * i + k) == 2 * (10 * i + k)
            await asyncio.sleep(0.001)

    await asyncio.gather(*[caller(i) for i in range(8)])
    # The first batch takes the early callers (k of them), every later one all eight until
    # the early callers run out of jobs: [k, 8, 8, 8 - k] (alternating: [k, 8 - k, k, ...]).
    sizes = batcher.batch_sizes
    assert len(sizes) == 4 and sizes[1:3] == [8, 8] and sizes[0] + sizes[3] == 8, sizes


def test_rejoin_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="rejoin_fraction"):
        MicroBatcher(Recorder(), max_wait_s=0.0, max_size=1, rejoin_fraction=-1)
