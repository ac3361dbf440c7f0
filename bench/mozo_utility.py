"""DPS-MOZO utility on the bundled summarisation set (dialogsum-mini), bundled SmolLM2, CPU.

ROUGE-L F1 (Google's ``rouge-score`` package, stemming on) of:

* zero-shot, greedy (``engine.generate``, temperature 0) and sampled (top-k, temperature 1:
  the zero-shot distribution DPS-MOZO samples from when every lambda is 0);
* DPS-MOZO+On, proven mode (max-log-ratio eps0, true (epsilon, delta)) and the paper's mode
  (Renyi constraint, nominal epsilon) at each ``--epsilons``: ONE private context of
  ``--exemplars`` dialogues answers all ``--items`` test dialogues (delta ``--delta``,
  default 1/|D| as in paper 004; n_shots 4, top-k 100, T_max ``--max-tokens``; eps0 or beta
  calibrated for items x T_max tokens at q = 4/|D|, as the server does);
* the paper's epsilon = infinity baseline, non-private ensemble decoding of 4 one-shot
  prompts (the same loop with the raw one-shot distributions), and an ordinary four-shot
  prompt decoded greedily.

Sampled rows are averaged over ``--seeds`` runs per item. Every output is cut at its first
newline (DPS-MOZO has no stop strings; the same cut for every method). Each row shows the mean
over items with a 95% t-interval and a 95% percentile-bootstrap interval of the per-item
ROUGE-L; the proof's cost is the paired per-item difference proven - paper at each epsilon,
with its 95% t-interval (a pairing of the same test items, not of the same random draws).

    nice -n 10 .venv/bin/python bench/mozo_utility.py --items 40 --exemplars 24 \
        --max-tokens 12 --seeds 1 --epsilons 1 2 4 8 --json runs/mozo_utility.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rouge_score import rouge_scorer  # type: ignore[import-untyped]

from dpicl.engines.base import Exemplar
from dpicl.engines.factory import build_engine
from dpicl.mechanisms.dps_mozo.calibration import calibrate_beta
from dpicl.mechanisms.dps_mozo.proven import calibrate_max_log_ratio
from dpicl.mechanisms.dps_mozo.release import (
    log_softmax,
    mozo_step,
    product_distribution,
    sample_shots,
    sample_token,
)
from dpicl.prompts import render

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "auditor" / "dpicl_audit" / "data" / "dialogsum_mini.jsonl"
TEMPLATE = "Summarise the dialogue in one sentence.\n\n{exemplars}\n\nInput: {query}\nOutput:"
N_SHOTS, TOP_K = 4, 100


def cut(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


class Shared:
    """All methods for one test item decoded side by side in ONE KV-cached session.

    The prompts (``|D|`` one-shot prompts, the zero-shot prompt, the four-shot prompt) are
    encoded once; the cache is then replicated for every method, and each decoding step
    advances every method's rows with that method's own token (one batched forward). Each
    method sees exactly the logits a session of its own would give it; only the prefill is
    shared, which is what makes 40 items x 12 methods fit on a shared 2-core machine.
    Bench-local: it drives the transformers session's internals, which the server never does.
    """

    def __init__(self, session: Any, n_methods: int) -> None:
        self.s = session
        self.c = n_methods
        self.n = session.n_prompts
        # The session's row groups (the zero-shot row runs apart from the one-shot rows).
        for g in session._groups:
            g.cache.batch_repeat_interleave(n_methods)
            g.attn = g.attn.repeat_interleave(n_methods, dim=0)
            g.pos = g.pos.repeat_interleave(n_methods, dim=0)
            g.last = g.last.repeat_interleave(n_methods, dim=0)

    def last(self, method: int) -> torch.Tensor:
        groups = self.s._groups
        first = groups[0].last
        out = torch.empty((self.n, first.shape[1]), dtype=first.dtype, device=first.device)
        for g in groups:
            out[g.at] = g.last[[r * self.c + method for r in range(len(g.at))]]
        return out

    def advance(self, tokens: Sequence[int]) -> None:
        eng = self.s._engine
        for g in self.s._groups:
            per_row = torch.tensor(list(tokens) * len(g.at), dtype=torch.long, device=eng.device)
            ones = torch.ones((g.attn.shape[0], 1), dtype=g.attn.dtype, device=eng.device)
            g.attn = torch.cat([g.attn, ones], 1)
            g.pos = g.pos + 1
            res = eng.forward(
                per_row[:, None], g.attn, g.pos[:, None], past=g.cache, use_cache=True
            )
            g.cache = res.past_key_values
            g.last = res.logits[:, -1, :].float()


async def main(args: argparse.Namespace) -> None:
    torch.set_grad_enabled(False)
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
    tokens = args.queries * args.max_tokens
    delta = args.delta if args.delta is not None else 1 / n_d
    q = N_SHOTS / n_d
    print(
        f"dialogsum-mini: |D|={n_d} private exemplars, {len(tests)} test items, "
        f"T_max={args.max_tokens}, n_shots={N_SHOTS}, top-k={TOP_K}, seeds={args.seeds}; "
        f"DP budget (epsilon, delta={delta:.4g}) over {args.queries} answer(s) = {tokens} "
        f"tokens at q={q:.3f}",
        flush=True,
    )
    # method name -> (kind, eps0, beta, alpha)
    methods: dict[str, tuple[str, float | None, float | None, int | None]] = {
        "zero-shot greedy": ("greedy-zero", None, None, None),
        "zero-shot sampled": ("sampled-zero", None, None, None),
    }
    calibration: dict[str, dict[str, float]] = {}
    for eps in args.epsilons:
        pc = calibrate_max_log_ratio(eps, delta, N_SHOTS, q, tokens)
        name = f"DPS-MOZO proven eps={eps:g}"
        methods[name] = ("mozo", pc.max_log_ratio, None, None)
        calibration[name] = {"eps0": pc.max_log_ratio, "per_token_epsilon": pc.per_token_epsilon}
        cal = calibrate_beta(eps, delta, None, tokens=tokens, sample_rate=q)
        name = f"DPS-MOZO paper eps={eps:g}"
        methods[name] = ("mozo", None, cal.beta, cal.alpha)
        calibration[name] = {"alpha": cal.alpha, "beta": cal.beta}
    methods["ensemble 4x one-shot (eps=inf)"] = ("ensemble", None, None, None)
    methods["four-shot prompt greedy"] = ("greedy-four", None, None, None)
    names = list(methods)
    for name, knobs in calibration.items():
        print(f"[{name}: " + " ".join(f"{k}={v:.5g}" for k, v in knobs.items()) + "]")

    # scores[method][item] = list over seeds
    scores: dict[str, list[list[float]]] = {m: [[] for _ in tests] for m in names}
    examples: dict[str, str] = {}
    lambdas: dict[str, list[float]] = {m: [] for m in names}
    four = private[:N_SHOTS]
    zero_row, four_row = n_d, n_d + 1
    for i, t in enumerate(tests):
        t0 = time.perf_counter()
        prompts = [
            *(render(TEMPLATE, [e], t["input"], task="generation") for e in private),
            render(TEMPLATE, [], t["input"], task="generation"),
            render(TEMPLATE, four, t["input"], task="generation"),
        ]
        for seed in range(args.seeds):
            rng = np.random.default_rng([seed, i])
            session = await engine.open_decoding(prompts, zero_shot_index=n_d, top_k=TOP_K)
            try:
                shared = Shared(session, len(names))
                out: list[list[int]] = [[] for _ in names]
                done = [False] * len(names)
                for step in range(args.max_tokens):
                    chosen: list[int] = []
                    for j, name in enumerate(names):
                        kind, eps0, beta, alpha = methods[name]
                        last = shared.last(j)
                        if done[j]:
                            chosen.append(engine.eos_token_id)
                            continue
                        if kind == "greedy-zero":
                            tok = int(torch.argmax(last[zero_row]))
                        elif kind == "greedy-four":
                            tok = int(torch.argmax(last[four_row]))
                        else:
                            top = torch.topk(last[zero_row], TOP_K).indices
                            logits = last[:, top].double().numpy()
                            top_ids = top.numpy().astype(np.int64)
                            if kind == "sampled-zero":
                                p = np.exp(log_softmax(logits[zero_row]))
                                tok = int(top_ids[sample_token(p, rng)])
                            else:
                                shots = sample_shots(n_d, N_SHOTS, rng)
                                if kind == "ensemble":
                                    p = product_distribution(logits[shots])
                                    tok = int(top_ids[sample_token(p, rng)])
                                else:
                                    st = mozo_step(
                                        logits[shots],
                                        logits[zero_row],
                                        top_ids,
                                        beta,
                                        alpha,
                                        rng,
                                        eps0=eps0,
                                    )
                                    lambdas[name].extend(st.lambdas.tolist())
                                    tok = st.token_id
                        if tok == session.eos_token_id:
                            done[j] = True
                        else:
                            out[j].append(tok)
                        chosen.append(tok)
                    if all(done) or step + 1 == args.max_tokens:
                        break
                    shared.advance(chosen)
                for j, name in enumerate(names):
                    text = cut(session.decode(out[j]))
                    scores[name][i].append(100 * scorer.score(t["output"], text)["rougeL"].fmeasure)
                    if i == 0 and seed == 0:
                        examples[name] = text
            finally:
                await session.aclose()
        print(f"[item {i + 1}/{len(tests)}: {time.perf_counter() - t0:.0f} s]", flush=True)
        if args.json is not None:  # partial per-item scores, so a killed run still reports
            args.json.parent.mkdir(parents=True, exist_ok=True)
            partial = {m: v[: i + 1] for m, v in scores.items()}
            args.json.with_suffix(".partial.json").write_text(json.dumps(partial))
    await engine.aclose()
    for name in calibration:
        calibration[name]["mean_lambda"] = statistics.fmean(lambdas[name])

    order = [
        "zero-shot greedy",
        "zero-shot sampled",
        *(f"DPS-MOZO {m} eps={e:g}" for e in args.epsilons for m in ("proven", "paper")),
        "ensemble 4x one-shot (eps=inf)",
        "four-shot prompt greedy",
    ]
    boot = np.random.default_rng(12345)
    summary: dict[str, dict[str, float]] = {}
    print(
        f"\n{'method':<32} {'ROUGE-L':>7} {'95% t-interval':>16} {'95% bootstrap':>16}"
        f"  {'mean lambda':>11}   example (item 0)"
    )
    for m in order:
        per_item = np.array([statistics.fmean(v) for v in scores[m]])
        mean, lo_t, hi_t = t_interval(per_item)
        lo_b, hi_b = bootstrap_interval(per_item, boot)
        summary[m] = {
            "mean": mean,
            "t_low": lo_t,
            "t_high": hi_t,
            "boot_low": lo_b,
            "boot_high": hi_b,
        } | calibration.get(m, {})
        lam = calibration.get(m, {}).get("mean_lambda")
        lam_s = f"{lam:11.4f}" if lam is not None else " " * 11
        print(
            f"{m:<32} {mean:7.2f} [{lo_t:6.2f}, {hi_t:6.2f}] [{lo_b:6.2f}, {hi_b:6.2f}]"
            f"  {lam_s}   {examples[m][:60]!r}"
        )
    print(f"reference (item 0): {tests[0]['output']!r}")
    print("\nwhat the proof costs: paired per-item difference proven - paper (ROUGE-L points)")
    costs: dict[str, dict[str, float]] = {}
    for e in args.epsilons:
        diff = np.array(
            [
                statistics.fmean(a) - statistics.fmean(b)
                for a, b in zip(
                    scores[f"DPS-MOZO proven eps={e:g}"],
                    scores[f"DPS-MOZO paper eps={e:g}"],
                    strict=True,
                )
            ]
        )
        mean, lo_t, hi_t = t_interval(diff)
        costs[f"eps={e:g}"] = {"mean": mean, "t_low": lo_t, "t_high": hi_t}
        print(f"eps={e:g}: {mean:+.2f} [{lo_t:+.2f}, {hi_t:+.2f}] (95% t-interval)")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "summary": summary,
                    "proven_minus_paper": costs,
                },
                indent=2,
            )
        )


def t_interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, ...]:
    """Mean and the two-sided Student-t interval of the mean."""
    from scipy.stats import t as student_t

    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if x.size < 2:
        return mean, mean, mean
    half = float(student_t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return mean, mean - half, mean + half


def bootstrap_interval(
    values: np.ndarray, rng: np.random.Generator, level: float = 0.95, n: int = 10_000
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over items."""
    idx = rng.integers(0, values.size, size=(n, values.size))
    means = values[idx].mean(axis=1)
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return float(lo), float(hi)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exemplars", type=int, default=12)
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument(
        "--queries",
        type=int,
        default=1,
        help="answers one (epsilon, delta) budget covers (the paper's calibration is "
        "infeasible below epsilon 4 when 40 answers share a 12-exemplar context)",
    )
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    ap.add_argument("--delta", type=float, default=None, help="default 1/|D|")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here")
    asyncio.run(main(ap.parse_args()))
