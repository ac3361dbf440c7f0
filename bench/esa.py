"""ESA benchmarks on the transformers engine with the bundled model and embedder.
Each ratio is measured side by side in one run (interleaved repetitions, medians).

1. Share of an ESA query's wall time spent outside the engine and the embedder (partition
   prompts, ledger charge in SQLite, noise, nearest candidate): target under 5%.
2. Candidate generation: the T_cand zero-shot candidates as one engine batch against one
   engine call per candidate.
3. Where a real-model ESA query's time goes (``--breakdown``; T = 4, 16 tokens, as served:
   the partition generations, the T_cand candidates, the embedding of both), with torch's
   idle OpenMP threads spinning (OpenMP's default, the server before issue 30) against
   waiting passively (``OMP_WAIT_POLICY=PASSIVE``, what ``dpicl serve`` now sets). The
   policy is read once per process, so each side runs in child processes, the two sides
   alternating; the load average is printed beside, since the ratio depends on it.

    .venv/bin/python bench/esa.py [--quick] [--breakdown [--reps 3]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpicl.engines.base import Embedder, Engine, FloatArray, GenerationParams, PromptSpec
from dpicl.engines.factory import build_embedder, build_engine
from dpicl.mechanisms.esa.pipeline import EsaCalibration, run_esa
from dpicl.pipelines.partitions import partition_prompts, zero_shot_prompt
from dpicl.privacy.accounting import MU2_RTOL
from dpicl.privacy.ledger import Ledger
from dpicl.serving.contexts import create_context
from dpicl.spec import ContextSpec
from dpicl.store.repository import ContextRepository, StoredContext

DIALOGUES = [
    ("Ann: Are we still on for lunch? Ben: Yes, 12:30 at the cafe.", "Ann and Ben meet at 12:30."),
    ("Tom: I lost my keys. Sue: Check the car.", "Tom lost his keys; Sue suggests the car."),
    ("Kim: The report is late. Lee: I'll finish it tonight.", "Lee will finish the report."),
    ("Max: Movie tonight? Eva: Only if it's a comedy.", "Eva wants a comedy tonight."),
]


async def dialogue_context(repo: ContextRepository, **mechanism: int) -> StoredContext:
    """An ESA context (epsilon 2, T = 4) over the dialogues, in ``repo`` (schema created)."""
    repo.create_schema()
    spec = ContextSpec.model_validate(
        {
            "task": "generation",
            "exemplars": [{"input": i, "output": o} for i, o in DIALOGUES * 2],
            "mechanism": {"name": "esa", "epsilon": 2.0, "partitions": 4, **mechanism},
        }
    )
    return await create_context(spec, repo)


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
        ctx = await dialogue_context(repo, candidates=4, max_tokens=24)
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
        n = ctx.record_as(EsaCalibration).candidates
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


async def parts_of_a_query(queries: int) -> dict[str, list[float]]:
    """Seconds of each part of ``queries`` served ESA queries (after one warm-up), in this
    process: partition generations, candidates and embedding, as ``run_esa`` calls them."""
    cache = Path.home() / ".cache" / "dpicl"
    engine = build_engine("transformers", model=None, cache_dir=cache, device="cpu")
    embedder = build_embedder(None, "cpu")
    out: dict[str, list[float]] = {"partitions": [], "candidates": [], "embedding": []}
    with tempfile.TemporaryDirectory() as d:
        repo = ContextRepository(f"sqlite:///{Path(d) / 'esa.db'}", rtol=MU2_RTOL)
        ctx = await dialogue_context(repo, max_tokens=16)
        m = ctx.mechanism
        query = "Joe: Can you feed the cat? Mia: Sure, after work."
        parts, zero = partition_prompts(ctx, query), zero_shot_prompt(ctx, query)
        cands = [zero] * int(m["candidates"])
        params = GenerationParams(max_tokens=16, temperature=float(m["temperature"]), seed=None)
        for i in range(queries + 1):
            t0 = time.perf_counter()
            a = await engine.generate(parts, params)
            t1 = time.perf_counter()
            b = await engine.generate(cands, params)
            t2 = time.perf_counter()
            await embedder.embed([*a, *b])
            t3 = time.perf_counter()
            if i:  # the first query warms caches and allocators
                out["partitions"].append(t1 - t0)
                out["candidates"].append(t2 - t1)
                out["embedding"].append(t3 - t2)
        repo.dispose()
    await engine.aclose()
    return out


def breakdown(reps: int) -> None:
    """Spinning against passive OpenMP waiting, each in child processes, alternating."""
    sides = {"spin (OpenMP default)": None, "passive": "PASSIVE"}
    times: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for _ in range(reps):
        for side, policy in sides.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            child = subprocess.run(
                [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True
            )
            if child.returncode:
                raise SystemExit(child.stderr[-2000:])
            got = json.loads(child.stdout.strip().splitlines()[-1])
            for part, ts in got.items():
                times[side].setdefault(part, []).extend(ts)
    for side in sides:
        med = {p: statistics.median(ts) for p, ts in times[side].items()}
        total = sum(med.values())
        shares = ", ".join(f"{p} {t:.2f} s ({t / total:.0%})" for p, t in med.items())
        print(f"[{side:<21}] ESA query, T=4, 16 tokens: {total:.2f} s = {shares}")
    a, b = (sum(statistics.median(ts) for ts in times[s].values()) for s in sides)
    print(f"spin / passive = x{a / b:.2f} (a whole query's engine and embedder time)")
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="ESA benchmarks")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="where a query's time goes")
    ap.add_argument("--reps", type=int, default=3, help="--breakdown: child runs per side")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(parts_of_a_query(2))))
    elif args.breakdown:
        breakdown(args.reps)
    else:
        asyncio.run(main(args.quick))
