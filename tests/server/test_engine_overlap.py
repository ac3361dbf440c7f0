"""Overlapped scoring batches (issue 46, item 2) on the real bundled SmolLM2 (CPU).

With ``overlap="on"`` the engine's score batcher launches the next batch before reading the
last one back. Scores carry no randomness of the engine's (the DP noise is drawn in the
server process from its own OS-seeded generators, DESIGN.md section 4), so every call must
get exactly the scores it gets from an engine without overlap, batch by batch as served.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpicl.engines.transformers import engine as engine_module
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.engines.tuning import EngineTuning
from dpicl.pipelines.partitions import partition_prompts
from dpicl.store.repository import ContextRepository
from tests.server.real_model import load_bundled
from tests.server.test_prefix_reuse import LABELS, QUERIES, news_context

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model() -> Iterator[TransformersEngine]:
    eng = load_bundled()
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture
async def repo(tmp_path: Path) -> AsyncIterator[ContextRepository]:
    r = ContextRepository(f"sqlite:///{tmp_path / 'ctx.db'}")
    r.create_schema()
    yield r
    r.dispose()


async def test_overlapped_batches_give_every_call_its_scores(
    model: TransformersEngine, repo: ContextRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    def sibling(overlap: str) -> TransformersEngine:
        tuning = EngineTuning(overlap=overlap, batch_max_prompts=5)
        return TransformersEngine(model.model_obj, model.tokenizer, model_name="t", tuning=tuning)

    on, off = sibling("on"), sibling("off")
    assert on.overlap and not off.overlap
    log: list[str] = []
    launch = engine_module.launch_score_jobs

    class Logged:
        def __init__(self, engine: Any, jobs: list[Any]) -> None:
            log.append(f"launch {len(jobs)}")
            self.pending = launch(engine, jobs)

        def collect(self) -> Any:
            log.append("collect")
            return self.pending.collect()

    ctx = await news_context(repo, partitions=3, seed=4)
    jobs = [partition_prompts(ctx, q) for q in [*QUERIES, *QUERIES]]
    ref = [await off.score_labels(p, LABELS) for p in jobs]  # one call at a time
    monkeypatch.setattr(engine_module, "launch_score_jobs", Logged)
    # Batches of at most 5 prompts: one call of 3 each, the later calls waiting behind the
    # first, so the engine launches one while the one before is still to be read back.
    got = await asyncio.gather(*[on.score_labels(p, LABELS) for p in jobs])
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_array_equal(g, r)
    assert log.count("collect") == len(on.score_batcher.batch_sizes) == len(jobs)
    assert log[:3] == ["launch 1", "launch 1", "collect"]  # the second before the first's read
