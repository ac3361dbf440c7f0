"""DPS-MOZO utility on the bundled summarisation set (dialogsum-mini), bundled SmolLM2, CPU.

ROUGE-L F1 (Google's ``rouge-score`` package, stemming on) of:

* zero-shot, greedy (``engine.generate``, temperature 0) and sampled (top-k, temperature 1:
  the zero-shot distribution DPS-MOZO samples from when every lambda is 0);
* DPS-MOZO+On at epsilon 1, 2, 4: ONE private context of ``--exemplars`` dialogues answers
  all ``--items`` test dialogues (delta = 1/|D|, n_shots 4, top-k 100, T_max ``--max-tokens``,
  beta calibrated for items x T_max tokens at q = 4/|D|, as the server does);
* the paper's epsilon = infinity baseline, non-private ensemble decoding of 4 one-shot
  prompts (the same loop with the raw one-shot distributions), and an ordinary four-shot
  prompt decoded greedily.

Sampled rows are averaged over ``--seeds`` runs. Every output is cut at its first newline
(DPS-MOZO has no stop strings; the same cut for every method). Mean +- standard error over
test items (of the per-item mean over seeds).

    .venv/bin/python bench/mozo_utility.py [--items 6] [--max-tokens 16] [--seeds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import numpy as np
from rouge_score import rouge_scorer  # type: ignore[import-untyped]

from dpicl.engines.base import Engine, Exemplar, GenerationParams, PromptSpec
from dpicl.engines.factory import build_engine
from dpicl.pipelines.mozo import mozo_decode
from dpicl.privacy.mozo_calibration import calibrate_beta
from dpicl.prompts import render

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "auditor" / "dpicl_audit" / "data" / "dialogsum_mini.jsonl"
TEMPLATE = "Summarise the dialogue in one sentence.\n\n{exemplars}\n\nInput: {query}\nOutput:"
N_SHOTS, TOP_K = 4, 100


def cut(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


async def sampled_zero_shot(
    engine: Engine, prompt: PromptSpec, t_max: int, rng: np.random.Generator
) -> str:
    """Sample from the zero-shot distribution over its top-k (temperature 1)."""
    session = await engine.open_decoding([prompt], zero_shot_index=0, top_k=TOP_K)
    ids: list[int] = []
    try:
        for t in range(t_max):
            step = await session.step()
            z = step.logits[0] - step.logits[0].max()
            p = np.exp(z) / np.exp(z).sum()
            tok = int(step.top_ids[int(rng.choice(p.size, p=p))])
            if tok == session.eos_token_id:
                break
            ids.append(tok)
            if t + 1 < t_max:
                await session.advance(tok)
        return session.decode(ids)
    finally:
        await session.aclose()


async def main(args: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    private = [Exemplar(r["input"], r["output"]) for r in rows[: args.exemplars]]
    tests = rows[args.exemplars : args.exemplars + args.items]
    if len(tests) < args.items:
        raise SystemExit(f"only {len(tests)} test items left after {args.exemplars} exemplars")
    engine = build_engine(
        "transformers", model=None, cache_dir=Path.home() / ".cache/dpicl", device="cpu"
    )
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    n_d = len(private)
    tokens = args.items * args.max_tokens
    print(
        f"dialogsum-mini: |D|={n_d} private exemplars, {len(tests)} test items, "
        f"T_max={args.max_tokens}, n_shots={N_SHOTS}, top-k={TOP_K}, seeds={args.seeds}; "
        f"DP budget over {tokens} tokens at q={N_SHOTS / n_d:.3f}, delta=1/|D|={1 / n_d:.4f}"
    )
    # scores[method][item] = list over seeds
    scores: dict[str, list[list[float]]] = {}
    examples: dict[str, str] = {}

    def add(method: str, item: int, text: str) -> None:
        s = scorer.score(tests[item]["output"], cut(text))["rougeL"].fmeasure
        scores.setdefault(method, [[] for _ in tests])[item].append(100 * s)
        if item == 0 and method not in examples:
            examples[method] = cut(text)

    def one_shots(query: str) -> list[PromptSpec]:
        return [render(TEMPLATE, [e], query, task="generation") for e in private]

    greedy = GenerationParams(max_tokens=args.max_tokens, temperature=0.0, seed=0, stop=("\n",))
    four = private[:N_SHOTS]
    for i, t in enumerate(tests):
        zp = render(TEMPLATE, [], t["input"], task="generation")
        fp = render(TEMPLATE, four, t["input"], task="generation")
        z_text, f_text = await engine.generate([zp, fp], greedy)
        add("zero-shot greedy", i, z_text)
        add("four-shot prompt greedy", i, f_text)
        for s in range(args.seeds):
            rng = np.random.default_rng([s, i, 0])
            add("zero-shot sampled", i, await sampled_zero_shot(engine, zp, args.max_tokens, rng))
    print(f"[baselines done in {time.perf_counter() - t_start:.0f} s]")

    for eps in args.epsilons:
        cal = calibrate_beta(eps, 1 / n_d, None, tokens=tokens, sample_rate=N_SHOTS / n_d)
        t0 = time.perf_counter()
        for s in range(args.seeds):
            rng = np.random.default_rng([s, 1000 + int(eps * 10)])
            for i, t in enumerate(tests):
                out = await mozo_decode(
                    engine,
                    [*one_shots(t["input"]), render(TEMPLATE, [], t["input"], task="generation")],
                    n_shots=N_SHOTS,
                    top_k=TOP_K,
                    max_tokens=args.max_tokens,
                    beta=cal.beta,
                    alpha=cal.alpha,
                    lam_max=1.5,
                    rng=rng,
                )
                add(f"DPS-MOZO eps={eps:g}", i, out.text)
        print(
            f"[eps={eps:g}: alpha={cal.alpha} beta={cal.beta:.5f}; "
            f"{time.perf_counter() - t0:.0f} s]"
        )
    t0 = time.perf_counter()
    for s in range(args.seeds):
        rng = np.random.default_rng([s, 7])
        for i, t in enumerate(tests):
            out = await mozo_decode(
                engine,
                [*one_shots(t["input"]), render(TEMPLATE, [], t["input"], task="generation")],
                n_shots=N_SHOTS,
                top_k=TOP_K,
                max_tokens=args.max_tokens,
                beta=0.0,
                alpha=2,
                lam_max=1.5,
                rng=rng,
                private=False,
            )
            add("ensemble 4x one-shot (eps=inf)", i, out.text)
    print(f"[ensemble: {time.perf_counter() - t0:.0f} s]")
    await engine.aclose()

    order = [
        "zero-shot greedy",
        "zero-shot sampled",
        *(f"DPS-MOZO eps={e:g}" for e in args.epsilons),
        "ensemble 4x one-shot (eps=inf)",
        "four-shot prompt greedy",
    ]
    summary: dict[str, tuple[float, float]] = {}
    print(f"\n{'method':<32} {'ROUGE-L F1':>10} {'+- s.e.':>8}   example (item 0)")
    for m in order:
        per_item = [statistics.fmean(v) for v in scores[m]]
        mean = statistics.fmean(per_item)
        se = statistics.stdev(per_item) / len(per_item) ** 0.5
        summary[m] = (mean, se)
        print(f"{m:<32} {mean:10.2f} {se:8.2f}   {examples[m][:70]!r}")
    print(f"reference (item 0): {tests[0]['output']!r}")

    lo = max(summary["zero-shot greedy"][0], summary["zero-shot sampled"][0])
    hi = max(summary["ensemble 4x one-shot (eps=inf)"][0], summary["four-shot prompt greedy"][0])
    ok = []
    for e in args.epsilons:
        mean, se = summary[f"DPS-MOZO eps={e:g}"]
        ok.append(lo - 2 * se <= mean <= hi + 2 * se)
        print(
            f"eps={e:g}: zero-shot best {lo:.2f} <= DPS-MOZO {mean:.2f} <= few-shot best "
            f"{hi:.2f} within 2 s.e. ({2 * se:.2f}): {ok[-1]}"
        )
    print(
        "order zero-shot <= DPS-MOZO <= few-shot within noise: "
        f"{'YES' if all(ok) else 'NO'} (noise: 2 standard errors over {len(tests)} items)"
    )
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exemplars", type=int, default=32)
    ap.add_argument("--items", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    asyncio.run(main(ap.parse_args()))
