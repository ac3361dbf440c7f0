"""What accuracy does private voting keep? BBC News topics, bundled SmolLM2, CPU.

For each test article (its lead paragraph; label one of five topics) and each context of
``--context`` exemplars drawn from the rest of the corpus, the bench scores the five labels
(the server's default classification template, labels scored, never parsed) after:

* the zero-shot prompt (no exemplars);
* one few-shot prompt holding ALL the context's exemplars (the non-private baseline on the
  same data);
* the T partition prompts of private voting (the server's positional partitioning), for
  every T in ``--partitions``.

From each T's clean votes it then releases the noisy argmax at every epsilon in
``--epsilons`` (the server's sigma: classic calibration, L2 sensitivity sqrt 2, ``--delta``)
and at epsilon = infinity (the clean argmax, ties at random). One noise draw per query and
setting, so each accuracy is a binomial proportion over the queries: the 95% interval is
Clopper-Pearson (scipy). ``expected`` is the mean over queries of the exact probability
that the noisy argmax is correct (noise averaged out; the clean votes are what varies).

The privacy cost of the evaluation itself. The BBC corpus is public, so the contexts here
are PUBLIC STAND-INS: the evaluation spends nothing. Each row says what the same evaluation
would spend on a private context: per answer (epsilon, delta), and for the whole evaluation
(all ``queries`` answers from one context, composed exactly with dp-accounting's PLD). A
deployer who evaluates on their own private context pays that from its budget.

    nice -n 10 .venv/bin/python bench/utility.py --queries 300 --contexts 6 \
        --json docs/utility.json --markdown docs/utility_table.md --plot docs/figures/utility.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import beta as beta_dist

from dpicl.domain import DEFAULT_TEMPLATES
from dpicl.engines.base import Engine, Exemplar, PromptSpec
from dpicl.engines.factory import build_engine
from dpicl.mechanisms.voting.release import (
    VOTING_SENSITIVITY,
    noisy_argmax,
    noisy_argmax_probabilities,
    vote_histogram,
)
from dpicl.pipelines.partitioning import assign_partitions, group_by_partition
from dpicl.pipelines.votes import partition_votes
from dpicl.privacy.calibration import epsilon_exact, sigma_for
from dpicl.prompts import render
from dpicl_audit.datasets import BBC_NEWS, LabelledDataset, load_dataset

TEMPLATE = DEFAULT_TEMPLATES["classification"]
INF = math.inf


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact two-sided binomial interval for k successes in n trials."""
    a = (1.0 - level) / 2.0
    lo = 0.0 if k == 0 else float(beta_dist.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta_dist.ppf(1.0 - a, k + 1, n - k))
    return lo, hi


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    method: str  # "zero-shot", "few-shot", "voting"
    partitions: int | None
    epsilon: float | None  # None: not private; inf: voting without noise
    queries: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    expected: float | None  # mean exact P(correct) over queries (voting only)
    sigma: float | None
    epsilon_per_answer: float | None  # what one answer spends on a private context
    epsilon_evaluation: float | None  # all `queries` answers from one context (PLD)


@dataclass
class Tally:
    correct: int = 0
    expected: float = 0.0
    n: int = 0


def split(data: LabelledDataset, contexts: int, size: int, queries: int, seed: int) -> Any:
    """Disjoint draws: ``contexts`` contexts of ``size`` exemplars, and ``queries`` test
    items shared among them in consecutive blocks (one context's prompts at a time, so the
    engine's prefix cache holds the context being evaluated)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data))
    need = contexts * size + queries
    if need > len(data):
        raise SystemExit(f"{need} items needed, the dataset has {len(data)}")
    ex = [data.examples[i] for i in order]
    ctxs = [
        [Exemplar(e.input, e.output) for e in ex[c * size : (c + 1) * size]]
        for c in range(contexts)
    ]
    tests = ex[contexts * size : need]
    return ctxs, tests


def prompts_for(
    context: list[Exemplar],
    cid: int,
    query: str,
    labels: Sequence[str],
    partitions: Sequence[int],
    seed: int,
) -> tuple[list[PromptSpec], dict[int, slice]]:
    """Zero-shot, few-shot, then every T's partition prompts; the slice of each T's rows."""

    def one(exs: Sequence[Exemplar], key: str) -> PromptSpec:
        p = render(TEMPLATE, exs, query, task="classification", labels=labels)
        return PromptSpec(
            text=p.text,
            query=p.query,
            exemplars=p.exemplars,
            instructions=p.instructions,
            prefix_chars=p.prefix_chars,
            cache_key=key,
            cache_scope=f"ctx{cid}",
        )

    out = [one((), "zero"), one(context, f"ctx{cid}-all")]
    rows: dict[int, slice] = {}
    for t in partitions:
        ids = assign_partitions(len(context), t, seed + cid)
        start = len(out)
        for j, idx in enumerate(group_by_partition(ids, t)):
            out.append(one([context[i] for i in idx], f"ctx{cid}-T{t}-p{j}"))
        rows[t] = slice(start, len(out))
    return out, rows


async def evaluate(args: argparse.Namespace, engine: Engine) -> dict[str, Any]:
    data = load_dataset(args.dataset)
    labels = list(data.labels)
    ctxs, tests = split(data, args.contexts, args.context, args.queries, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    sigmas = {
        eps: sigma_for(eps, args.delta, VOTING_SENSITIVITY, "classic") for eps in args.epsilons
    }
    zero, few = Tally(), Tally()
    votes: dict[tuple[int, float], Tally] = {
        (t, e): Tally() for t in args.partitions for e in [*args.epsilons, INF]
    }
    t0 = time.perf_counter()
    for q, item in enumerate(tests):
        cid = q * len(ctxs) // len(tests)
        prompts, rows = prompts_for(ctxs[cid], cid, item.input, labels, args.partitions, args.seed)
        scores = np.asarray(await engine.score_labels(prompts, labels), dtype=np.float64)
        truth = labels.index(item.output)
        for tally, row in ((zero, 0), (few, 1)):
            tally.n += 1
            tally.correct += int(int(np.argmax(scores[row])) == truth)
        for t, sl in rows.items():
            clean = vote_histogram(partition_votes(scores[sl], 0.0, rng), len(labels))
            for eps in [*args.epsilons, INF]:
                sigma = 0.0 if eps == INF else sigmas[eps]
                released, _ = noisy_argmax(clean, sigma, rng)
                tally = votes[(t, eps)]
                tally.n += 1
                tally.correct += int(released == truth)
                if sigma > 0:
                    tally.expected += float(noisy_argmax_probabilities(clean, sigma)[truth])
                else:
                    top = clean == clean.max()
                    tally.expected += float(top[truth]) / float(top.sum())
        if args.progress and (q + 1) % args.progress == 0:
            el = time.perf_counter() - t0
            print(f"  {q + 1}/{len(tests)} queries, {el:.0f} s", flush=True)
    n = len(tests)

    def row(method: str, t: int | None, eps: float | None, tally: Tally, expected: bool) -> Row:
        lo, hi = clopper_pearson(tally.correct, tally.n)
        sigma = None if eps is None or eps == INF else sigmas[eps]
        spent = None if sigma is None else epsilon_exact(sigma, VOTING_SENSITIVITY, args.delta, n)
        return Row(
            method=method,
            partitions=t,
            epsilon=eps,
            queries=tally.n,
            correct=tally.correct,
            accuracy=tally.correct / tally.n,
            ci_low=lo,
            ci_high=hi,
            expected=tally.expected / tally.n if expected else None,
            sigma=sigma,
            epsilon_per_answer=eps,
            epsilon_evaluation=spent,
        )

    table = [row("zero-shot", None, None, zero, False), row("few-shot", None, None, few, False)]
    for t in args.partitions:
        for eps in [*args.epsilons, INF]:
            table.append(row("voting", t, eps, votes[(t, eps)], True))
    return {
        "dataset": data.name,
        "dataset_size": len(data),
        "labels": labels,
        "model": engine.model,
        "engine": engine.name,
        "simulator": engine.is_simulator,
        "context_size": args.context,
        "contexts": args.contexts,
        "queries": n,
        "delta": args.delta,
        "calibration": "classic",
        "seed": args.seed,
        "seconds": round(time.perf_counter() - t0, 1),
        "stand_in": "public corpus as a stand-in for a private context: nothing was charged",
        "rows": [asdict(r) for r in table],
    }


def _eps(e: float | None) -> str:
    if e is None:
        return "-"
    return "inf" if e == INF else f"{e:g}"


def _finite(value: Any) -> Any:
    """JSON has no infinity: epsilon = inf is written as the string "inf"."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def markdown(result: dict[str, Any]) -> str:
    head = (
        "| method | T | epsilon per answer | accuracy (95% CI) | expected | sigma | "
        f"epsilon for all {result['queries']} answers |\n"
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |\n"
    )
    lines = []
    for r in result["rows"]:
        acc = f"{r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        exp = "-" if r["expected"] is None else f"{r['expected']:.3f}"
        sig = "-" if r["sigma"] is None else f"{r['sigma']:.2f}"
        spent = "-" if r["epsilon_evaluation"] is None else f"{r['epsilon_evaluation']:.1f}"
        if r["method"] == "voting" and r["epsilon"] == INF:
            spent = "inf"
        t = "-" if r["partitions"] is None else str(r["partitions"])
        lines.append(
            f"| {r['method']} | {t} | {_eps(r['epsilon'])} | {acc} | {exp} | {sig} | {spent} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    eps_list = sorted({r["epsilon"] for r in rows if r["method"] == "voting"})
    xs = list(range(len(eps_list)))
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=120)
    colours = {2: "#1f77b4", 4: "#ff7f0e", 8: "#2ca02c"}
    ts = sorted({r["partitions"] for r in rows if r["method"] == "voting"})
    width = 0.08
    for k, t in enumerate(ts):
        sel = [r for r in rows if r["method"] == "voting" and r["partitions"] == t]
        sel.sort(key=lambda r: r["epsilon"])
        off = (k - (len(ts) - 1) / 2) * width
        y = [r["accuracy"] for r in sel]
        err = [
            [r["accuracy"] - r["ci_low"] for r in sel],
            [r["ci_high"] - r["accuracy"] for r in sel],
        ]
        ax.errorbar(
            [x + off for x in xs], y, yerr=err, marker="o", capsize=3,
            color=colours.get(t), label=f"private voting, T = {t}",
        )  # fmt: skip
    refs: list[tuple[float, str, str]] = []
    for method, style in (("few-shot", "--"), ("zero-shot", ":")):
        r = next(r for r in rows if r["method"] == method)
        ax.axhline(r["accuracy"], color="black", linestyle=style, linewidth=1.2, zorder=5)
        ax.axhspan(r["ci_low"], r["ci_high"], color="grey", alpha=0.10)
        refs.append((r["accuracy"], f"{method} {r['accuracy']:.2f}", "black"))
    chance = 1.0 / len(result["labels"])
    ax.axhline(chance, color="grey", linewidth=0.8, zorder=4)
    refs.append((chance, f"chance {chance:.2f}", "grey"))
    # the labels of lines that lie close together are spread apart, never printed on top
    # of one another
    refs.sort()
    placed: list[float] = []
    for y, text, colour in refs:
        at = max(y, placed[-1] + 0.05) if placed else y
        placed.append(at)
        ax.text(
            xs[-1] + 0.35, at, text, va="center", fontsize=8, color=colour,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1}, zorder=6,
        )  # fmt: skip
    ax.set_xticks(xs, [_eps(e) for e in eps_list])
    ax.set_xlim(-0.4, xs[-1] + 1.4)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"epsilon per answer (delta = {result['delta']:g})")
    ax.set_ylabel("accuracy (95% Clopper-Pearson)")
    ax.set_title(
        f"{result['dataset']}: {result['queries']} queries, contexts of "
        f"{result['context_size']} exemplars, {result['model'].split(' ')[0]}",
        fontsize=9,
    )
    # below the axes: never over the data
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--dataset", default=BBC_NEWS, help="dataset spec (default bbc-news)")
    p.add_argument("--engine", default="transformers", choices=["transformers", "oracle"])
    p.add_argument("--model", help="model directory or hub name (default: bundled SmolLM2)")
    p.add_argument(
        "--from-json", type=Path, help="re-render the table and plot of a saved run (no model)"
    )
    p.add_argument("--queries", type=int, default=300, help="test items (default 300)")
    p.add_argument("--contexts", type=int, default=6, help="contexts drawn (default 6)")
    p.add_argument("--context", type=int, default=16, help="exemplars per context (default 16)")
    p.add_argument("--partitions", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    p.add_argument("--delta", type=float, default=1e-5, help="per-answer delta (default 1e-5)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--progress", type=int, default=20, help="print every N queries (0: never)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    p.add_argument("--plot", type=Path, help="write the figure here (PNG)")
    args = p.parse_args(argv)
    if max(args.partitions) > args.context:
        p.error("every T must be <= --context")
    return args


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    engine = build_engine(
        args.engine, model=args.model, cache_dir=Path.home() / ".cache/dpicl", device="cpu"
    )
    try:
        return await evaluate(args, engine)
    finally:
        await engine.aclose()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.from_json:
        result = json.loads(args.from_json.read_text())
        for r in result["rows"]:
            r["epsilon"] = INF if r["epsilon"] == "inf" else r["epsilon"]
    else:
        result = asyncio.run(amain(args))
    table = markdown(result)
    print(
        f"{result['dataset']} ({result['dataset_size']} items), {result['engine']} "
        f"{result['model']}{' [SIMULATOR]' if result['simulator'] else ''}, "
        f"{result['queries']} queries, {result['seconds']} s; {result['stand_in']}"
    )
    print(table)
    if args.json and not args.from_json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_finite(result), indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table)
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    main()
