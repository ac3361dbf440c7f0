"""LLM calls per second for private-voting queries on a GPU, against paper 000's anchor.

Paper 000 reports about 700 GPU-hours for 8M LLM calls with Llama-3-8B, i.e. about
3.2 calls/s on one H100 (``ANCHOR``). A voting query with T = 10 partitions is 10 LLM calls
(one label-scored prompt per partition, scored in one engine call). This prints, for each
engine (transformers on ``--device``; vLLM where it is installed) and each model (the bundled
SmolLM2-135M; a Llama-3-8B-shaped model built from its config with random weights, which has
the compute of the real one and needs no download), the calls/s at each concurrency (queries
in flight at once) and the ratio to the anchor, all measured in this one run.

On a CUDA machine::

    DPICL_DEVICE=cuda python bench/gpu.py                  # both models, 1/16/64 in flight
    DPICL_DEVICE=cuda python bench/gpu.py --models bundled --engines transformers

``--tiny`` replaces the 8B shape with a 2-layer toy (the test runs the benchmark that way on
CPU); the ratios it prints then say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpicl.domain import DEFAULT_TEMPLATES
from dpicl.engines.base import Engine, Exemplar, PromptSpec
from dpicl.engines.models import DEFAULT_CACHE_DIR, resolve_llm
from dpicl.prompts import render

ANCHOR = 3.2  # LLM calls/s on one H100 in paper 000 (700 GPU-hours for 8M calls, Llama-3-8B)
T = 10  # partitions per voting query = LLM calls per query
LABELS = ("Business", "Sports", "Sci/Tech", "World")
EXEMPLARS = [
    Exemplar("The central bank raised interest rates again this quarter", "Business"),
    Exemplar("The striker scored twice in the final minutes of the derby", "Sports"),
    Exemplar("Researchers unveiled a faster quantum processor prototype", "Sci/Tech"),
    Exemplar("Leaders met in Geneva to discuss the ceasefire proposal", "World"),
]
QUERIES = [
    "Oil prices fell sharply after the output agreement",
    "The champion retired after a record tenth title",
    "A new battery chemistry doubles the range of electric cars",
    "Elections were called after the coalition collapsed",
]

# Llama-3-8B's shape (its config.json); the weights are random.
LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
}


@dataclass(frozen=True, slots=True)
class Row:
    engine: str
    model: str
    concurrency: int
    queries: int
    seconds: float

    @property
    def calls_per_s(self) -> float:
        return self.queries * T / self.seconds


def query_prompts(i: int, scope: str) -> list[PromptSpec]:
    """The T partition prompts of voting query ``i`` (each partition: 2 demonstrations)."""
    q = QUERIES[i % len(QUERIES)] + f" (item {i})"
    template = DEFAULT_TEMPLATES["classification"]
    return [
        render(
            template,
            [EXEMPLARS[(p + j) % len(EXEMPLARS)] for j in range(2)],
            q,
            task="classification",
            labels=LABELS,
            cache_scope=scope,
        )
        for p in range(T)
    ]


async def run_load(engine: Engine, concurrency: int, queries: int) -> float:
    """Seconds to answer ``queries`` voting queries with ``concurrency`` in flight."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            scores = await engine.score_labels(query_prompts(i, "ctx_bench"), LABELS)
            assert scores.shape == (T, len(LABELS))

    await one(0)  # warm-up (compilation, caches)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(queries)))
    return time.perf_counter() - t0


def random_llama_dir(shape: dict[str, Any], tokenizer_from: Path, root: Path) -> Path:
    """A Llama model directory: ``config.json`` of ``shape`` and the bundled tokenizer (no
    weights: transformers initialises them at random, vLLM with ``load_format="dummy"``)."""
    from transformers import AutoTokenizer, LlamaConfig

    out = root / ("llama-" + "x".join(str(shape[k]) for k in ("hidden_size", "num_hidden_layers")))
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_from))
    tok.save_pretrained(str(out))
    cfg = LlamaConfig(
        **shape,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    cfg.save_pretrained(str(out))
    return out


def transformers_engine(model_dir: Path, device: str, random_weights: bool) -> Engine:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from dpicl.engines.transformers import TransformersEngine

    if not random_weights:
        return TransformersEngine.load(model_dir, device=device, model_name=model_dir.name)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    cfg = AutoConfig.from_pretrained(str(model_dir))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    return TransformersEngine(model, tok, model_name=model_dir.name, device=device)


def vllm_engine(model_dir: Path, random_weights: bool, eager: bool) -> Engine:
    from dpicl.engines.vllm import VllmEngine, VllmOptions

    return VllmEngine.load(
        model_dir,
        model_name=model_dir.name,
        options=VllmOptions(
            load_format="dummy" if random_weights else "auto",
            enforce_eager=eager,
            max_model_len=2048,
        ),
    )


async def bench_engine(
    name: str, engine: Engine, model: str, levels: Sequence[int], queries: int
) -> list[Row]:
    rows = []
    try:
        for c in levels:
            n = max(queries, c)
            rows.append(Row(name, model, c, n, await run_load(engine, c, n)))
    finally:
        await engine.aclose()
    return rows


def main(argv: Sequence[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=os.environ.get("DPICL_DEVICE", "cuda"))
    ap.add_argument("--engines", default="transformers,vllm")
    ap.add_argument("--models", default="bundled,8b")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--queries", type=int, default=64, help="queries per level (>= level)")
    ap.add_argument("--tiny", action="store_true", help="toy shape instead of the 8B (tests)")
    ap.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs/compile")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vllm is not installed here: the vLLM rows are skipped")
        engines.remove("vllm")
    cache = Path(os.environ.get("DPICL_CACHE_DIR", str(DEFAULT_CACHE_DIR)))
    bundled = Path(resolve_llm(None, cache))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        models: list[tuple[str, Path, bool]] = []
        for m in args.models.split(","):
            if m == "bundled":
                models.append(("SmolLM2-135M", bundled, False))
            elif m == "8b":
                shape, label = (
                    (TINY, "tiny-llama") if args.tiny else (LLAMA3_8B, "llama3-8b-random")
                )
                models.append((label, random_llama_dir(shape, bundled, Path(tmp)), True))
            else:
                raise SystemExit(f"unknown model {m!r}; expected bundled or 8b")
        for label, path, random_weights in models:
            for e in engines:
                engine = (
                    transformers_engine(path, args.device, random_weights)
                    if e == "transformers"
                    else vllm_engine(path, random_weights, args.eager)
                )
                rows += asyncio.run(bench_engine(e, engine, label, levels, args.queries))
    print(f"voting queries with T={T} (LLM calls/query = {T}); anchor = {ANCHOR} calls/s")
    print(f"(paper 000, Llama-3-8B on one H100); device = {args.device}")
    print(
        f"{'engine':<13}{'model':<18}{'in flight':>10}{'queries':>9}{'calls/s':>11}{'x anchor':>10}"
    )
    for r in rows:
        print(
            f"{r.engine:<13}{r.model:<18}{r.concurrency:>10}{r.queries:>9}"
            f"{r.calls_per_s:>11.1f}{r.calls_per_s / ANCHOR:>10.1f}"
        )
    for e in {r.engine for r in rows}:
        for m in {r.model for r in rows}:
            mine = sorted(
                (r for r in rows if r.engine == e and r.model == m), key=lambda r: r.concurrency
            )
            if len(mine) > 1:
                print(
                    f"{e} {m}: {mine[-1].concurrency} in flight / 1 in flight = "
                    f"{mine[-1].calls_per_s / mine[0].calls_per_s:.2f}x"
                )
    return rows


if __name__ == "__main__":
    main()
