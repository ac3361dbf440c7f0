"""Zero-shot, few-shot, per-partition and private (voting) accuracy of the bundled model on
the labelled corpora the project can ship, with and without calibration, beside the
majority-class rate (issue 45, items 1 and 4).

It scores prompts exactly as the server's voting partitions do (the context template of
``dpicl.domain``, ``Engine.score_labels`` of the transformers engine, in this process) on the
utility audit's own draws (:func:`dpicl_audit.utility.plan.draw_split`: ``--queries``
held-out queries round-robin over ``--contexts`` draws of ``--exemplars``). Per query:

* zero-shot: the template with no exemplar;
* few-shot: one prompt holding all the draw's exemplars (the audit's few-shot baseline);
* partitions: the draw cut into ``--partitions`` consecutive parts (the draw is already a
  random permutation; the server permutes by ``partition_seed`` instead, which gives
  partitions of the same size and law), each voting as a voting partition does; "one
  partition" is partition 0's vote;
* private: voting's release at ``--epsilon`` over those votes, the server's sigma
  (:func:`dpicl.privacy.calibration.sigma_for`, Delta2 = sqrt(2)); its accuracy is the exact
  expectation over the noise (:func:`noisy_argmax_probabilities`) and one sampled release per
  query from a generator seeded by ``--seed``, whose count gets the interval.

Calibrations: ``none``; ``content-free`` (Zhao et al. 2021: each label's log-probability
minus its log-probability for "N/A" under the same exemplars, the server's
``label_calibration: "content-free"``); ``exemplars`` (measured here only, not a server option:
the bias is estimated as the mean label distribution of the partition's own exemplar inputs
under its own prompt, the batch estimate of Zhou et al. 2024 with the partition's exemplars as
the batch; the vote stays a function of that partition alone, so voting's sensitivity is
unchanged). Every accuracy carries its exact 95% Clopper-Pearson interval over the queries.

    PYTHONPATH=services:auditor:. HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python bench/utility_calibration.py --datasets reviews-mini --queries 100

Slow on CPU: about (2 + partitions) prompts per query, plus one per exemplar.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import get_args

import numpy as np
import numpy.typing as npt
from scipy.special import log_softmax
from scipy.stats import binomtest

from dpicl.domain import DEFAULT_TEMPLATES
from dpicl.engines.base import Engine, Exemplar
from dpicl.engines.factory import EngineName, build_engine
from dpicl.mechanisms.voting.release import (
    VOTING_SENSITIVITY,
    noisy_argmax,
    noisy_argmax_probabilities,
)
from dpicl.pipelines.votes import CONTENT_FREE
from dpicl.privacy.calibration import sigma_for
from dpicl.prompts import plan
from dpicl_audit.datasets import LabelledDataset, load_dataset
from dpicl_audit.utility.plan import UtilityPlan, draw_split

FloatArray = npt.NDArray[np.float64]
CALIBRATIONS = ("none", "content-free", "exemplars")


def calibrated(scores: FloatArray, reference: FloatArray) -> FloatArray:
    """Row by row: log-softmax of ``scores`` (n, L) minus the mean log-softmax of the
    ``reference`` rows (m, L): the content-free input's one row (Zhao et al. 2021), or the
    partition's exemplar inputs (the batch estimate of Zhou et al. 2024, in log space)."""
    bias = log_softmax(reference, axis=1).mean(axis=0, keepdims=True)
    return np.asarray(log_softmax(scores, axis=1) - bias, dtype=np.float64)


def _ci(k: int, n: int) -> dict[str, float]:
    ci = binomtest(k, n).proportion_ci(method="exact")
    return {"value": k / n, "low": float(ci.low), "high": float(ci.high), "n": n}


class _Scorer:
    """One draw's prompts scored: queries, the content-free input, the exemplar inputs."""

    def __init__(self, engine: Engine, labels: list[str]) -> None:
        self.engine, self.labels = engine, labels
        self.template = DEFAULT_TEMPLATES["classification"]

    async def votes(
        self, shots: Sequence[Exemplar], queries: Sequence[str]
    ) -> dict[str, FloatArray]:
        """The queries' scores under each calibration (the exemplar one needs exemplars)."""
        p = plan(self.template, list(shots), task="classification", labels=self.labels)
        texts = [*queries, CONTENT_FREE, *(e.input for e in shots)]
        raw = np.asarray(await self.engine.score_labels([p.prompt(t) for t in texts], self.labels))
        n = len(queries)
        out = {"none": raw[:n], "content-free": calibrated(raw[:n], raw[n : n + 1])}
        if shots:
            out["exemplars"] = calibrated(raw[:n], raw[n + 1 :])
        return out


async def measure(
    name: str, args: argparse.Namespace, engine: Engine, rng: np.random.Generator
) -> dict[str, object]:
    data: LabelledDataset = load_dataset(name)
    labels = list(data.labels)
    t, per = args.partitions, args.exemplars // args.partitions
    audit = UtilityPlan(
        dataset=name,
        queries=args.queries,
        exemplars=args.exemplars,
        contexts=args.contexts,
        partitions=[t],
        seed=args.seed,
    )
    draws = draw_split(len(data), audit)
    truth = np.array([labels.index(data.examples[int(i)].output) for i in draws.queries])
    n = truth.size
    picks: dict[str, np.ndarray] = {}
    part_votes = {c: np.zeros((n, t), dtype=np.int64) for c in CALIBRATIONS}
    scorer = _Scorer(engine, labels)
    t0 = time.perf_counter()
    for j, draw in enumerate(draws.contexts):
        rows = [i for i in range(n) if draws.context_of(i) == j]
        if not rows:
            continue
        texts = [data.examples[int(draws.queries[i])].input for i in rows]
        shots = [Exemplar(data.examples[int(k)].input, data.examples[int(k)].output) for k in draw]
        for kind, use in (("zero-shot", []), ("few-shot", shots)):
            for cal, s in (await scorer.votes(use, texts)).items():
                picks.setdefault(f"{kind} {cal}", np.zeros(n, dtype=np.int64))[rows] = s.argmax(1)
        for p in range(t):
            scored = await scorer.votes(shots[p * per : (p + 1) * per], texts)
            for cal, s in scored.items():
                part_votes[cal][rows, p] = s.argmax(1)
    took = time.perf_counter() - t0
    sigma = sigma_for(args.epsilon, args.delta, VOTING_SENSITIVITY)
    out: dict[str, object] = {
        "dataset": name,
        "labels": labels,
        "queries": n,
        "exemplars": args.exemplars,
        "partitions": t,
        "per_partition": per,
        "epsilon": args.epsilon,
        "sigma": sigma,
        "seconds": round(took, 1),
    }
    label, count = Counter(truth.tolist()).most_common(1)[0]
    out["majority"] = _ci(count, n) | {"label": labels[label]}

    def acc(chosen: np.ndarray) -> dict[str, object]:
        answers = Counter(labels[int(c)] for c in chosen).most_common()
        return _ci(int((chosen == truth).sum()), n) | {"answers": dict(answers)}

    for key, chosen in picks.items():
        out[key] = acc(chosen)
    for cal, votes in part_votes.items():
        out[f"one partition ({per}) {cal}"] = acc(votes[:, 0])
        hist = [np.bincount(v, minlength=len(labels)).astype(np.float64) for v in votes]
        expected = float(
            np.mean(
                [noisy_argmax_probabilities(h, sigma)[y] for h, y in zip(hist, truth, strict=True)]
            )
        )
        released = np.array([noisy_argmax(h, sigma, rng)[0] for h in hist], dtype=np.int64)
        out[f"private eps={args.epsilon:g} {cal}"] = acc(released) | {"expected": expected}
    return out


async def _main(args: argparse.Namespace) -> None:
    engine = build_engine(args.engine)
    rng = np.random.default_rng(args.seed)
    try:
        for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
            print(json.dumps(await measure(name, args, engine, rng)), flush=True)
    finally:
        await engine.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--datasets", default="reviews-mini,news-mini,bbc-news")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--exemplars", type=int, default=16, help="per draw (the audit's default)")
    ap.add_argument("--partitions", type=int, default=4, help="voting's T (the audit's default)")
    ap.add_argument("--contexts", type=int, default=4, help="exemplar draws")
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument(
        "--engine", default="transformers", choices=get_args(EngineName), help="oracle: tests"
    )
    asyncio.run(_main(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
