"""Private voting on the real model (transformers engine, bundled SmolLM2). Each ratio is
measured side by side in one run (interleaved repetitions, medians).

1. Prefix reuse: the latency of a whole voting query (``run_voting``: partitioning, prompts,
   SQLite ledger charge, label scoring, noise, argmax) with the context's prefix KV cache
   warm, against the same query cold (cache cleared before each query: every partition
   prefix is encoded, then the query on top) and against the engine with the cache off
   (the path before prefix reuse), at T = 4 and T = 10 with two exemplars per partition
   (paper 000's default), and at T = 10 with four. Each side's tokens through the model
   (pads included) are counted too: their ratio is the speed-up a cost linear in tokens
   would give, which shows how close the measured ratio is to what skipping the prefix can
   give at all (the cold side encodes the instructions all partitions share only once).
2. The DP layer's share of a real-model query (warm cache, T = 10): the time of the
   partitioning and prompt building, the ledger charge, the mechanism (votes, noise,
   argmax) and the budget status, each measured on its own, against the engine call they
   surround; also the whole query against its engine call alone.
3. Batching within a query: the T partition prompts as one engine batch against one call
   per prompt (cache off on both sides, so the comparison is of batching alone).
4. The warm path's parts (warm T = 10 engine calls): as served (cached prefixes laid out in
   a slot cache in reused scratch memory, new tokens written in place; the vocabulary
   projection in blocks) against each part turned back: the slot cache in fresh memory
   every batch (``kv_workspace_mib=0``), the prefixes stacked in a ``DynamicCache`` (the
   path before), the projection as one matrix product. Also the page faults per call, a
   sampled ten-partition generation (ESA's partition step) the same ways, and the engine's
   inverse-CDF sampler against ``torch.multinomial``.

    .venv/bin/python bench/voting.py [--reps 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from dpicl.engines.base import GenerationParams
from dpicl.engines.factory import build_engine
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.engines.transformers.generation import sample
from dpicl.engines.tuning import EngineTuning
from dpicl.mechanisms.voting.pipeline import VotingCalibration, run_voting
from dpicl.mechanisms.voting.release import private_vote
from dpicl.pipelines.partitions import partition_prompts
from dpicl.privacy.ledger import Ledger
from dpicl.serving.contexts import cost_of
from voting_setup import CACHE_DIR, interleaved, news_context, query, temp_repo


def sibling(engine: TransformersEngine, **tuning: float) -> TransformersEngine:
    """The same loaded model behind another engine object with other settings."""
    return TransformersEngine(
        engine.model_obj,
        engine.tokenizer,
        model_name=engine.model,
        tuning=EngineTuning(**tuning),  # type: ignore[arg-type]
    )


class TokenCounter:
    """Tokens (pads included) that go through ``model`` in its forward calls (pass the
    decoder, ``base_model``: prefix encodings call it without the vocabulary head)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self._hook = model.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, _module: object, _args: object, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids")
        self.count += 0 if ids is None else int(ids.numel())

    def close(self) -> None:
        self._hook.remove()


async def prefix_reuse(
    engine: TransformersEngine, partitions: int, reps: int, *, shots: int = 2
) -> None:
    off = sibling(engine, prefix_cache_mib=0)
    tokens = TokenCounter(engine.model_obj.base_model)
    used: dict[str, list[int]] = {"warm": [], "cold": [], "off": []}
    with temp_repo() as repo:
        ledger = Ledger(repo)
        ctx = await news_context(repo, partitions, per_partition=shots)
        rng = np.random.default_rng()
        counter = iter(range(10**9))

        async def ask(side: str, eng: TransformersEngine) -> object:
            before = tokens.count
            out = await run_voting(ctx, query(next(counter)), engine=eng, ledger=ledger, rng=rng)
            used[side].append(tokens.count - before)
            return out

        async def warm() -> object:
            return await ask("warm", engine)

        async def cold() -> object:
            engine.prefix_cache.clear()
            return await ask("cold", engine)

        async def uncached() -> object:
            return await ask("off", off)

        try:
            t = await interleaved({"warm": warm, "cold": cold, "off": uncached}, reps)
        finally:
            tokens.close()
    n = {side: statistics.median(v) for side, v in used.items()}
    speedup, work = t["cold"] / t["warm"], n["cold"] / n["warm"]
    print(
        f"[prefix reuse  ] voting query latency at T={partitions:2d}, {shots} exemplars per "
        f"partition: warm prefix {t['warm'] * 1e3:7.1f} ms, cold (cache miss) "
        f"{t['cold'] * 1e3:7.1f} ms, cache off {t['off'] * 1e3:7.1f} ms -> warm vs cold "
        f"x{speedup:.2f}, warm vs off x{t['off'] / t['warm']:.2f}\n"
        f"{'':17s}tokens through the model per query: warm {n['warm']:.0f}, cold "
        f"{n['cold']:.0f}, off {n['off']:.0f} -> work ratio cold/warm x{work:.2f}; the "
        f"measured speed-up is {speedup / work:.0%} of it"
    )


def median_time(fn: Callable[[], object], reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


async def dp_share(engine: TransformersEngine, partitions: int, reps: int, small: int) -> None:
    with temp_repo() as repo:
        ledger = Ledger(repo)
        ctx = await news_context(repo, partitions)
        rng = np.random.default_rng()
        cost = cost_of(ctx)
        cal = ctx.record_as(VotingCalibration)
        sigma, temp = cal.sigma, cal.temperature
        q = query(0)
        prompts = partition_prompts(ctx, q)
        scores = await engine.score_labels(prompts, ctx.labels)

        async def full() -> object:
            return await run_voting(ctx, q, engine=engine, ledger=ledger, rng=rng)

        async def raw() -> object:
            return await engine.score_labels(prompts, ctx.labels)

        async def charge() -> object:
            return await ledger.charge(ctx, cost)

        t = await interleaved({"full": full, "engine": raw}, reps)
        t_ledger = (await interleaved({"charge": charge}, small))["charge"]
        t_part = median_time(lambda: partition_prompts(ctx, q), small)
        t_mech = median_time(lambda: private_vote(scores, sigma, temp, rng), small)
        t_status = median_time(lambda: Ledger.status(ctx, cost), small)
    dp = t_part + t_ledger + t_mech + t_status
    print(
        f"[DP layer share] real-model voting query, T={partitions}, warm prefix: engine "
        f"{t['engine'] * 1e3:.1f} ms; DP layer {dp * 1e3:.2f} ms = partitioning and prompts "
        f"{t_part * 1e3:.2f} + ledger charge (SQLite) {t_ledger * 1e3:.2f} + mechanism "
        f"{t_mech * 1e3:.3f} + budget status {t_status * 1e3:.3f} -> share of the query "
        f"{dp / (dp + t['engine']) * 100:.2f}%\n"
        f"{'':17s}whole query {t['full'] * 1e3:.1f} ms vs its engine call alone "
        f"{t['engine'] * 1e3:.1f} ms -> ratio {t['full'] / t['engine']:.3f}"
    )


async def batching(engine: TransformersEngine, partitions: int, reps: int) -> None:
    off = sibling(engine, prefix_cache_mib=0)
    with temp_repo() as repo:
        ctx = await news_context(repo, partitions)
    prompts = partition_prompts(ctx, query(0))

    async def batched() -> object:
        return await off.score_labels(prompts, ctx.labels)

    async def one_by_one() -> object:
        return [await off.score_labels([p], ctx.labels) for p in prompts]

    t = await interleaved({"batched": batched, "single": one_by_one}, reps)
    print(
        f"[batching      ] {partitions} partition prompts as one batch "
        f"{t['batched'] * 1e3:8.1f} ms vs one by one {t['single'] * 1e3:8.1f} ms "
        f"-> speed-up x{t['single'] / t['batched']:.2f}"
    )


@contextmanager
def dynamic_caches(engine: TransformersEngine) -> Iterator[None]:
    """Cached prefixes stacked in a ``DynamicCache`` (the path before slot caches) for a
    while."""
    engine.slot_caches = False
    try:
        yield
    finally:
        engine.slot_caches = True


@contextmanager
def one_call_head(engine: TransformersEngine) -> Iterator[None]:
    """The model's vocabulary projection as one ``nn.Linear`` (same weight) for a while."""
    blocked = engine.model_obj.get_output_embeddings()
    # Built on the meta device: no weight of its own is allocated or initialised.
    plain = torch.nn.Linear(blocked.in_features, blocked.out_features, bias=False, device="meta")
    plain.weight = blocked.weight
    engine.model_obj.set_output_embeddings(plain)
    try:
        yield
    finally:
        engine.model_obj.set_output_embeddings(blocked)


async def warm_path_parts(engine: TransformersEngine, partitions: int, reps: int) -> None:
    fresh = sibling(engine, kv_workspace_mib=0)
    with temp_repo() as repo:
        ctx = await news_context(repo, partitions)
    labels = list(ctx.labels)
    counter = iter(range(10**9))
    for eng in (engine, fresh):  # warm both prefix caches
        await eng.score_labels(partition_prompts(ctx, query(next(counter))), labels)
    faults: dict[str, list[int]] = {}

    def side(name: str, eng: TransformersEngine) -> Callable[[], Awaitable[object]]:
        async def run() -> object:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            out = await eng.score_labels(partition_prompts(ctx, query(next(counter))), labels)
            faults.setdefault(name, []).append(
                resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            )
            return out

        return run

    async def stacked() -> object:
        with dynamic_caches(engine):
            return await side("stacked", engine)()

    async def plain_head() -> object:
        with one_call_head(engine):
            return await side("one-call head", engine)()

    t = await interleaved(
        {
            "served": side("served", engine),
            "fresh memory": side("fresh memory", fresh),
            "stacked": stacked,
            "one-call head": plain_head,
        },
        reps,
    )
    f = {name: statistics.median(v) for name, v in faults.items()}
    print(
        f"[warm path     ] warm T={partitions} engine call as served {t['served'] * 1e3:.1f} ms "
        f"({f['served']:.0f} page faults) vs slot cache in fresh memory "
        f"{t['fresh memory'] * 1e3:.1f} ms ({f['fresh memory']:.0f}) -> x"
        f"{t['fresh memory'] / t['served']:.3f}; vs prefixes stacked in a DynamicCache "
        f"{t['stacked'] * 1e3:.1f} ms ({f['stacked']:.0f}) -> x{t['stacked'] / t['served']:.3f}; "
        f"vs one-call vocabulary projection {t['one-call head'] * 1e3:.1f} ms -> x"
        f"{t['one-call head'] / t['served']:.3f}"
    )
    params = GenerationParams(max_tokens=16, temperature=1.0, seed=0)
    prompts = partition_prompts(ctx, query(0))

    async def served_gen() -> object:
        return await engine.generate(prompts, params)

    async def stacked_gen() -> object:
        with dynamic_caches(engine):
            return await engine.generate(prompts, params)

    async def plain_head_gen() -> object:
        with one_call_head(engine):
            return await engine.generate(prompts, params)

    g = await interleaved(
        {"served": served_gen, "stacked": stacked_gen, "one-call head": plain_head_gen}, reps
    )
    print(
        f"{'':17s}{partitions} partition generations of 16 sampled tokens (ESA's partition "
        f"step), warm: as served {g['served'] * 1e3:.1f} ms vs prefixes stacked in a "
        f"DynamicCache {g['stacked'] * 1e3:.1f} ms -> x{g['stacked'] / g['served']:.3f}; vs "
        f"one-call vocabulary projection {g['one-call head'] * 1e3:.1f} ms -> x"
        f"{g['one-call head'] / g['served']:.3f}"
    )
    logits = torch.randn(partitions, engine.vocab_size)
    gens = [torch.Generator().manual_seed(i) for i in range(partitions)]
    t_cdf = median_time(lambda: sample(logits, 1.0, gens), 50)
    probs = torch.softmax(logits, dim=-1)
    t_mult = median_time(
        lambda: [torch.multinomial(probs[b : b + 1], 1, generator=g) for b, g in enumerate(gens)],
        50,
    )
    print(
        f"[sampling      ] one token for each of {partitions} rows of {engine.vocab_size} "
        f"logits, each row its own generator: inverse CDF (the engine's sample) "
        f"{t_cdf * 1e3:.2f} ms vs torch.multinomial {t_mult * 1e3:.2f} ms -> x{t_mult / t_cdf:.2f}"
    )


async def main(quick: bool, reps: int) -> None:
    engine = build_engine("transformers", model=None, cache_dir=CACHE_DIR, device="cpu")
    assert isinstance(engine, TransformersEngine)
    reps = 1 if quick else reps
    try:
        for t in (2,) if quick else (4, 10):
            await prefix_reuse(engine, t, reps=reps)
        if not quick:
            await prefix_reuse(engine, 10, reps=reps, shots=4)
        await dp_share(engine, 2 if quick else 10, reps=reps, small=5 if quick else 200)
        await batching(engine, 2 if quick else 10, reps=reps)
        await warm_path_parts(engine, 2 if quick else 10, reps=reps)
    finally:
        await engine.aclose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny run (for the smoke test)")
    ap.add_argument("--reps", type=int, default=8, help="repetitions of each side")
    args = ap.parse_args()
    asyncio.run(main(args.quick, args.reps))
