"""The vLLM engine against the transformers engine, side by side in one run (CPU builds).

1. DPS-MOZO per-token cost: one decoding session over |D| one-shot prompts + the zero-shot
   prompt (top-k = 100), ``step`` + ``advance`` per token: the transformers engine's KV-cache
   loop against the vLLM engine's single-step requests over the prefix cache.
2. The prefix cache on voting: ``score_labels`` on the T = 10 partition prompts of a query,
   cold (a context scope never seen: only the prompts' shared system/instruction blocks hit
   each other) against warm (the same context asked again: the exemplar blocks are cached),
   on the vLLM engine; the transformers engine's time for the same call is printed beside.

Run it in the vLLM environment (``make vllm-env``)::

    VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 \\
        .venv-vllm/bin/python bench/vllm_decoding.py [--tokens 16] [--block-size 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from dpicl.domain import DEFAULT_TEMPLATES
from dpicl.engines.base import Engine, Exemplar, PromptSpec
from dpicl.engines.models import DEFAULT_CACHE_DIR, resolve_llm
from dpicl.prompts import render

DIALOGUES = [
    Exemplar("Ann: Lunch at noon? Ben: Sure, see you at the cafe.", "Ann and Ben meet for lunch."),
    Exemplar("Tom: Did you send the report? Eva: Yes, this morning.", "Eva sent the report."),
    Exemplar("Max: The train is late. Joe: I'll pick you up.", "Joe will pick Max up."),
    Exemplar("Sue: Can I borrow your bike? Kim: Of course.", "Kim lends Sue her bike."),
    Exemplar("Liz: Tennis at five? Pat: Yes, court two.", "Liz and Pat play tennis at five."),
    Exemplar("Raj: The printer is broken. Ida: I'll call IT.", "Ida will call IT."),
    Exemplar("Bo: Dinner on Friday? Cy: Can't, maybe Saturday.", "Bo and Cy move dinner."),
    Exemplar("Al: Where are the keys? Di: On the hook.", "The keys are on the hook."),
]
QUERY = "Joe: Can you feed the cat tonight? Mia: Sure, after work."
NEWS = [
    Exemplar("The central bank raised interest rates again this quarter", "Business"),
    Exemplar("The striker scored twice in the final minutes of the derby", "Sports"),
    Exemplar("Researchers unveiled a faster quantum processor prototype", "Sci/Tech"),
    Exemplar("Leaders met in Geneva to discuss the ceasefire proposal", "World"),
]
LABELS = ("Business", "Sports", "Sci/Tech", "World")


def mozo_prompts() -> list[PromptSpec]:
    t = DEFAULT_TEMPLATES["generation"]
    one = [render(t, [e], QUERY, task="generation", cache_scope="ctx_m") for e in DIALOGUES]
    return [*one, render(t, [], QUERY, task="generation", cache_scope="ctx_m")]


def voting_prompts(scope: str) -> list[PromptSpec]:
    t = DEFAULT_TEMPLATES["classification"]
    q = "Oil prices fell sharply after the output agreement"
    return [
        render(
            t,
            [NEWS[(p + j) % 4] for j in range(3)],
            q,
            task="classification",
            labels=LABELS,
            cache_scope=scope,
        )
        for p in range(10)
    ]


async def per_token(engine: Engine, tokens: int, top_k: int) -> tuple[float, float]:
    """(seconds to open the session, median seconds per token: step + advance)."""
    prompts = mozo_prompts()
    t0 = time.perf_counter()
    session = await engine.open_decoding(prompts, zero_shot_index=len(prompts) - 1, top_k=top_k)
    opened = time.perf_counter() - t0
    times = []
    for i in range(tokens):
        t0 = time.perf_counter()
        step = await session.step()
        # A fixed, engine-independent choice (rank i mod 3) so both decode the same suffix.
        await session.advance(int(step.top_ids[i % 3]))
        times.append(time.perf_counter() - t0)
    await session.aclose()
    return opened, statistics.median(times)


async def scoring(engine: Engine, reps: int) -> tuple[float, float]:
    """(median cold seconds, median warm seconds) of one T = 10 voting call."""
    cold, warm = [], []
    for _ in range(reps):
        scope = f"ctx_{uuid.uuid4().hex}"
        t0 = time.perf_counter()
        await engine.score_labels(voting_prompts(scope), LABELS)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await engine.score_labels(voting_prompts(scope), LABELS)
        warm.append(time.perf_counter() - t0)
    return statistics.median(cold), statistics.median(warm)


async def run(args: argparse.Namespace) -> None:
    from dpicl.engines.transformers.engine import TransformersEngine
    from dpicl.engines.vllm.engine import VllmEngine
    from dpicl.engines.vllm.options import VllmOptions

    path = resolve_llm(None, Path(os.environ.get("DPICL_CACHE_DIR", str(DEFAULT_CACHE_DIR))))
    hf = TransformersEngine.load(path, model_name="SmolLM2")
    vl = VllmEngine.load(
        path,
        model_name="SmolLM2",
        options=VllmOptions(
            block_size=args.block_size,
            enforce_eager=True,
            max_model_len=2048,
            kv_cache_gib=0.5,
        ),
    )
    try:
        await per_token(hf, 2, args.top_k)  # warm-up
        await per_token(vl, 2, args.top_k)
        h_open, h_tok = await per_token(hf, args.tokens, args.top_k)
        v_open, v_tok = await per_token(vl, args.tokens, args.top_k)
        n = len(mozo_prompts())
        print(
            f"DPS-MOZO decoding, {n} prompts (|D|={n - 1} one-shot + zero-shot), "
            f"top_k={args.top_k}, {args.tokens} tokens, median per token:"
        )
        print(f"  transformers KV loop   {h_tok * 1e3:8.1f} ms/token  (open {h_open * 1e3:.0f} ms)")
        print(f"  vLLM single-step reqs  {v_tok * 1e3:8.1f} ms/token  (open {v_open * 1e3:.0f} ms)")
        print(f"  vLLM / transformers    {v_tok / h_tok:8.2f}x per token")
        await scoring(vl, 1)
        v_cold, v_warm = await scoring(vl, args.reps)
        h_cold, h_warm = await scoring(hf, args.reps)
        print(f"voting score_labels, T=10 prompts, 4 labels, vLLM block_size={args.block_size}:")
        print(f"  vLLM cold context      {v_cold * 1e3:8.1f} ms")
        print(
            f"  vLLM warm context      {v_warm * 1e3:8.1f} ms   (prefix hits: "
            f"cold / warm = {v_cold / v_warm:.2f}x)"
        )
        print(
            f"  transformers           {statistics.fmean([h_cold, h_warm]) * 1e3:8.1f} ms   "
            f"(vLLM warm / transformers = {v_warm / statistics.fmean([h_cold, h_warm]):.2f}x)"
        )
    finally:
        await vl.aclose()
        await hf.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    asyncio.run(run(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
