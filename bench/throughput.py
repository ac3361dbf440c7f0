"""Voting throughput at concurrency 1 against concurrency 16, each engine measured in one run.

What it compares: private-voting queries per second through the server's request pipeline
(``run_voting``: partitioning, prompts, the SQLite ledger charge, the engine's label
scoring, Gaussian noise, noisy argmax; everything a ``/v1/classify`` request does except
HTTP), with 1 client against 16 concurrent clients, each client sending its next query when
its last one is answered. Queries go round-robin over ``--contexts`` contexts of T
partitions; the transformers engine's prefix cache is warm (steady state: each context has
been queried before). On the transformers engine a third side runs 16 clients with
batching across requests turned off, to show what the micro-batcher contributes, and a
fourth pair of sides bounds what batching can give at all: the model's raw forward
throughput (tokens/s, random token ids, no cache) at the shape of one query's rows against
the shape of 16 queries' rows merged. Where that ratio is small the model is compute-bound
at concurrency 1 and no batching reaches a large concurrency ratio.

Engines come from ``dpicl.engines.factory.build_engine`` (any engine plugs in); rounds
alternate between the sides and the median rate of each side is reported.

    .venv/bin/python bench/throughput.py [--engine transformers --engine oracle --engine vllm]
        [--partitions 4] [--contexts 4] [--queries 32] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from dpicl.engines.base import Engine
from dpicl.engines.factory import build_engine
from dpicl.errors import EngineError
from dpicl.mechanisms.voting.pipeline import run_voting
from dpicl.privacy.ledger import Ledger
from dpicl.store.repository import StoredContext
from voting_setup import CACHE_DIR, interleaved, news_context, query, temp_repo


async def rate(
    engine: Engine, ledger: Ledger, contexts: list[StoredContext], concurrency: int, n: int
) -> float:
    """Queries per second for ``n`` queries from ``concurrency`` closed-loop clients."""
    todo = iter(range(n))
    rng = np.random.default_rng()

    async def client() -> None:
        for i in todo:
            ctx = contexts[i % len(contexts)]
            await run_voting(ctx, query(i), engine=engine, ledger=ledger, rng=rng)

    t0 = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(concurrency)])
    return n / (time.perf_counter() - t0)


def forward_rate(engine: Engine, rows: int, width: int) -> Callable[[], Awaitable[None]]:
    """A side that runs one raw forward of ``rows`` x ``width`` random tokens (no prefix:
    the cached prefix adds attention keys, a small share of the work at this size)."""
    import torch

    model: Any = getattr(engine, "model_obj")  # noqa: B009 - transformers engine only
    ids = torch.randint(100, 1000, (rows, width), generator=torch.Generator().manual_seed(0))

    async def side() -> None:
        def run() -> None:
            with torch.inference_mode():
                model(input_ids=ids, logits_to_keep=1)

        await asyncio.to_thread(run)

    return side


async def bench_engine(name: str, args: argparse.Namespace) -> None:
    try:
        engine = build_engine(name, model=None, cache_dir=CACHE_DIR, device="cpu")  # type: ignore[arg-type]
    except EngineError as exc:
        print(f"[{name:12s}] skipped: {exc}")
        return
    n = args.queries * (20 if engine.is_simulator else 1)
    high = args.concurrency
    batcher = getattr(engine, "score_batcher", None)
    try:
        with temp_repo() as repo:
            ledger = Ledger(repo)
            contexts = [
                await news_context(repo, args.partitions, seed=s) for s in range(args.contexts)
            ]
            await rate(engine, ledger, contexts, 1, len(contexts))  # warm-up: fill caches
            sides: dict[str, list[float]] = {"c1": [], f"c{high}": []}
            if batcher is not None:
                sides[f"c{high}-unbatched"] = []
            for _ in range(args.rounds):
                sides["c1"].append(await rate(engine, ledger, contexts, 1, n))
                sides[f"c{high}"].append(await rate(engine, ledger, contexts, high, n))
                if batcher is not None:
                    size, batcher.max_size = batcher.max_size, 1
                    try:
                        qps = await rate(engine, ledger, contexts, high, n)
                    finally:
                        batcher.max_size = size
                    sides[f"c{high}-unbatched"].append(qps)
            if batcher is not None:
                # The query side's tokens per partition row (query, template tail,
                # generation prompt, label branch) on SmolLM2: about 23.
                width = 23
                one = forward_rate(engine, args.partitions, width)
                many = forward_rate(engine, args.partitions * high, width)
                t = await interleaved({"one": one, "many": many}, args.rounds)
                ceiling = (high * t["one"]) / t["many"]
    finally:
        await engine.aclose()
    med = {k: statistics.median(v) for k, v in sides.items()}
    print(
        f"[{name:12s}] voting queries/s through the pipeline (T={args.partitions}, "
        f"{args.contexts} contexts, SQLite ledger, {n} queries x {args.rounds} rounds, "
        f"medians): concurrency 1 {med['c1']:8.2f} q/s, concurrency {high} "
        f"{med[f'c{high}']:8.2f} q/s -> ratio x{med[f'c{high}'] / med['c1']:.2f}"
    )
    if batcher is not None:
        off = med[f"c{high}-unbatched"]
        print(
            f"{'':15s}concurrency {high} with batching across requests off {off:8.2f} q/s "
            f"-> the micro-batcher gives x{med[f'c{high}'] / off:.2f}"
        )
        print(
            f"{'':15s}compute ceiling: raw forward of {args.partitions * high} rows x {width} "
            f"tokens vs {args.partitions} rows x {width}, tokens/s ratio x{ceiling:.2f} "
            f"(what merging {high} queries can give when compute-bound)"
        )


async def main(args: argparse.Namespace) -> None:
    for name in args.engine or ["oracle", "transformers"]:
        await bench_engine(name, args)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", action="append", choices=["transformers", "oracle", "vllm"])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--contexts", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--queries", type=int, default=48, help="queries per side and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a tiny run (for the smoke test)")
    parsed = ap.parse_args()
    if parsed.quick:
        parsed.partitions, parsed.contexts, parsed.concurrency = 2, 2, 4
        parsed.queries, parsed.rounds = 4, 1
    asyncio.run(main(parsed))
