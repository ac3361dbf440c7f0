"""ESA benchmarks on the transformers engine with the bundled model and embedder.
Each ratio is measured side by side in one run (interleaved repetitions, medians).

1. Share of an ESA query's wall time spent outside the engine and the embedder (partition
   prompts, ledger charge in SQLite, noise, nearest candidate): target under 5%.
2. Candidate generation: the T_cand zero-shot candidates as one engine batch against one
   engine call per candidate.

    .venv/bin/python bench/esa.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpicl.domain import ContextSpec
from dpicl.engines.base import Embedder, Engine, FloatArray, GenerationParams, PromptSpec
from dpicl.engines.factory import build_embedder, build_engine
from dpicl.pipelines.contexts import create_context
from dpicl.pipelines.esa import run_esa
from dpicl.pipelines.partitions import zero_shot_prompt
from dpicl.privacy.accounting import MU2_RTOL
from dpicl.privacy.ledger import Ledger
from dpicl.store.repository import ContextRepository

DIALOGUES = [
    ("Ann: Are we still on for lunch? Ben: Yes, 12:30 at the cafe.", "Ann and Ben meet at 12:30."),
    ("Tom: I lost my keys. Sue: Check the car.", "Tom lost his keys; Sue suggests the car."),
    ("Kim: The report is late. Lee: I'll finish it tonight.", "Lee will finish the report."),
    ("Max: Movie tonight? Eva: Only if it's a comedy.", "Eva wants a comedy tonight."),
]


class TimedEngine:
    """Wraps an engine and an embedder and adds up the time spent inside them."""

    def __init__(self, engine: Engine, embedder: Embedder) -> None:
        self.inner, self.emb = engine, embedder
        self.name, self.model, self.is_simulator = engine.name, engine.model, engine.is_simulator
        self.dim = embedder.dim
        self.spent = 0.0

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        t0 = time.perf_counter()
        try:
            return await self.inner.generate(prompts, params)
        finally:
            self.spent += time.perf_counter() - t0

    async def embed(self, texts: Sequence[str]) -> FloatArray:
        t0 = time.perf_counter()
        try:
            return await self.emb.embed(texts)
        finally:
            self.spent += time.perf_counter() - t0


async def main(quick: bool) -> None:
    cache = Path.home() / ".cache" / "dpicl"
    engine = build_engine("transformers", model=None, cache_dir=cache, device="cpu")
    embedder = build_embedder(None, "cpu")
    timed = TimedEngine(engine, embedder)
    reps = 3 if quick else 8
    with tempfile.TemporaryDirectory() as d:
        repo = ContextRepository(f"sqlite:///{Path(d) / 'esa.db'}", rtol=MU2_RTOL)
        repo.create_schema()
        spec = ContextSpec.model_validate(
            {
                "task": "generation",
                "exemplars": [{"input": i, "output": o} for i, o in DIALOGUES * 2],
                "mechanism": {
                    "name": "esa",
                    "epsilon": 2.0,
                    "partitions": 4,
                    "candidates": 4,
                    "max_tokens": 24,
                },
            }
        )
        ctx = await create_context(spec, repo)
        query = "Joe: Can you feed the cat? Mia: Sure, after work."
        rng = np.random.default_rng()
        ledger = Ledger(repo)
        totals, inside = [], []
        for _ in range(reps):
            timed.spent = 0.0
            t0 = time.perf_counter()
            await run_esa(
                ctx,
                query,
                engine=timed,
                embedder=timed,
                ledger=ledger,  # type: ignore[arg-type]
                rng=rng,
            )
            totals.append(time.perf_counter() - t0)
            inside.append(timed.spent)
        outside = [t - i for t, i in zip(totals, inside, strict=True)]
        share = statistics.median(o / t for o, t in zip(outside, totals, strict=True))
        print(
            f"ESA query: {statistics.median(totals) * 1e3:.0f} ms, outside engine+embedder "
            f"{statistics.median(outside) * 1e3:.2f} ms -> share {share * 100:.2f}% (target < 5%)"
        )
        zero = zero_shot_prompt(ctx, query)
        params = GenerationParams(max_tokens=24, temperature=1.0, seed=1)
        n = int(ctx.mechanism["candidates"])
        tb, ts = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            await engine.generate([zero] * n, params)
            tb.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(n):
                await engine.generate([zero], params)
            ts.append(time.perf_counter() - t0)
        b, s = statistics.median(tb), statistics.median(ts)
        print(
            f"candidates: {n} zero-shot candidates batched {b * 1e3:.0f} ms vs sequential "
            f"{s * 1e3:.0f} ms -> speed-up x{s / b:.2f}"
        )
        repo.dispose()
    await engine.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="ESA benchmarks")
    ap.add_argument("--quick", action="store_true")
    asyncio.run(main(ap.parse_args().quick))
