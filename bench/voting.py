"""Private voting benchmarks. Each ratio is measured side by side in one run.

1. DP-layer overhead: a full voting query through the pipeline (partitioning, prompt
   rendering, ledger charge in SQLite, Gaussian noise, noisy argmax) against only the raw
   engine call it makes (``engine.score_labels`` on the same T prompts). Measured on the
   oracle simulator and on the transformers engine with the bundled model.
2. Batching: the T partition prompts sent as one engine batch against one call per prompt,
   on the transformers engine.

Interleaved repetitions (A, B, A, B, ...) and medians keep a noisy shared machine fair.

    .venv/bin/python bench/voting.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from dpicl.domain import ContextSpec
from dpicl.engines.base import Engine
from dpicl.engines.factory import build_engine
from dpicl.pipelines.contexts import cost_of, create_context
from dpicl.pipelines.partitions import partition_prompts
from dpicl.pipelines.voting import run_voting
from dpicl.privacy.accounting import MU2_RTOL
from dpicl.privacy.ledger import Ledger
from dpicl.store.repository import ContextRepository

TEXTS = [
    ("The central bank raised interest rates again", "Business"),
    ("The striker scored twice in the derby", "Sports"),
    ("A faster quantum processor was unveiled", "Sci/Tech"),
    ("Leaders met in Geneva about the ceasefire", "World"),
]


async def paired(
    a: Callable[[], Awaitable[object]], b: Callable[[], Awaitable[object]], reps: int
) -> tuple[float, float]:
    """Median seconds of a and b, run interleaved."""
    ta: list[float] = []
    tb: list[float] = []
    await a()
    await b()  # warm-up
    for _ in range(reps):
        t0 = time.perf_counter()
        await a()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await b()
        tb.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


async def overhead(engine: Engine, reps: int, partitions: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        repo = ContextRepository(f"sqlite:///{Path(d) / 'bench.db'}", rtol=MU2_RTOL)
        repo.create_schema()
        ledger = Ledger(repo)
        spec = ContextSpec.model_validate(
            {
                "task": "classification",
                "labels": ["World", "Sports", "Business", "Sci/Tech"],
                "exemplars": [
                    {"input": f"{t} (report {i})", "output": lab}
                    for i, (t, lab) in enumerate(TEXTS * (partitions // 2))
                ],
                "mechanism": {"name": "voting", "epsilon": 1.0, "partitions": partitions},
            }
        )
        ctx = await create_context(spec, repo)
        query = "Shares fell sharply after the earnings report"
        prompts = partition_prompts(ctx, query)
        rng = np.random.default_rng()

        async def full() -> object:
            return await run_voting(ctx, query, engine=engine, ledger=ledger, rng=rng)

        async def raw() -> object:
            return await engine.score_labels(prompts, ctx.labels)

        cost = cost_of(ctx)

        async def charge_only() -> object:
            return await ledger.charge(ctx, cost)

        t_full, t_raw = await paired(full, raw, reps)
        t_charge, _ = await paired(charge_only, raw, max(5, reps // 4))
        repo.dispose()
    dp = max(t_full - t_raw - t_charge, 0.0)
    print(
        f"[{engine.name:12s}] voting query {t_full * 1e3:9.2f} ms vs its raw engine calls "
        f"{t_raw * 1e3:9.2f} ms (T={partitions}) -> ratio {t_full / t_raw:.3f}\n"
        f"{'':15s}of which the DP maths and prompt building {dp * 1e3:.3f} ms "
        f"({dp / t_raw * 100:+.2f}% of the engine time) and the durable SQLite ledger "
        f"charge {t_charge * 1e3:.2f} ms ({t_charge / t_raw * 100:+.2f}%)"
    )


async def batching(engine: Engine, reps: int, partitions: int) -> None:
    spec = ContextSpec.model_validate(
        {
            "task": "classification",
            "labels": ["World", "Sports", "Business", "Sci/Tech"],
            "exemplars": [
                {"input": f"{t} (report {i})", "output": lab}
                for i, (t, lab) in enumerate(TEXTS * (partitions // 2))
            ],
            "mechanism": {"name": "voting", "epsilon": 1.0, "partitions": partitions},
        }
    )
    with tempfile.TemporaryDirectory() as d:
        repo = ContextRepository(f"sqlite:///{Path(d) / 'b.db'}")
        repo.create_schema()
        ctx = await create_context(spec, repo)
        repo.dispose()
    prompts = partition_prompts(ctx, "Shares fell sharply after the earnings report")

    async def batched() -> object:
        return await engine.score_labels(prompts, ctx.labels)

    async def one_by_one() -> object:
        return [await engine.score_labels([p], ctx.labels) for p in prompts]

    t_b, t_s = await paired(batched, one_by_one, reps)
    print(
        f"[{engine.name:12s}] batching: {partitions} prompts as one batch {t_b * 1e3:8.1f} ms vs "
        f"one by one {t_s * 1e3:8.1f} ms -> speed-up x{t_s / t_b:.2f}"
    )


async def main(quick: bool) -> None:
    oracle = build_engine(
        "oracle", model=None, cache_dir=Path.home() / ".cache/dpicl", device="cpu"
    )
    await overhead(oracle, reps=200 if quick else 1000, partitions=10)
    tf = build_engine(
        "transformers", model=None, cache_dir=Path.home() / ".cache/dpicl", device="cpu"
    )
    await overhead(tf, reps=5 if quick else 15, partitions=10)
    await batching(tf, reps=3 if quick else 8, partitions=10)
    await tf.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    asyncio.run(main(ap.parse_args().quick))
