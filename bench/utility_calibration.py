"""Zero-shot and few-shot accuracy of the bundled model on the labelled corpora the project
can ship, with and without contextual calibration (Zhao et al. 2021, "Calibrate before use":
each label's probability divided by its probability for a content-free input, "N/A", under
the same exemplars), beside the majority-class rate (issue 45, item 4).

It scores prompts exactly as the server's voting partitions do (the context template of
``dpicl.domain``, ``Engine.score_labels`` of the transformers engine, in this process), so a
"few-shot" figure here is what a partition holding all the draw's exemplars votes, and a
calibrated one what it would vote with calibration. Every figure is an accuracy over
``--queries`` held-out queries with its exact 95% Clopper-Pearson interval.

    PYTHONPATH=services:auditor:. HF_HUB_OFFLINE=1 .venv/bin/python bench/utility_calibration.py \
        --datasets news-mini,bbc-news --queries 40 --exemplars 8

Slow on CPU: each query is three prompts (zero-shot, few-shot, content-free) per dataset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

import numpy as np
from scipy.special import log_softmax
from scipy.stats import binomtest

from dpicl.domain import DEFAULT_TEMPLATES
from dpicl.engines.base import Exemplar
from dpicl.engines.factory import build_engine
from dpicl.prompts import plan
from dpicl_audit.datasets import load_dataset

CONTENT_FREE = "N/A"


def _ci(k: int, n: int) -> dict[str, float]:
    ci = binomtest(k, n).proportion_ci(method="exact")
    return {"value": k / n, "low": float(ci.low), "high": float(ci.high), "n": n}


async def measure(name: str, queries: int, exemplars: int, seed: int) -> dict[str, object]:
    data = load_dataset(name)
    labels = list(data.labels)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data))
    held, pool = order[:queries], order[queries : queries + exemplars]
    shots = [Exemplar(data.examples[i].input, data.examples[i].output) for i in pool]
    template = DEFAULT_TEMPLATES["classification"]
    few = plan(template, shots, task="classification", labels=labels)
    zero = plan(template, [], task="classification", labels=labels)
    engine = build_engine("transformers")
    texts = [data.examples[i].input for i in held]
    truth = [data.examples[i].output for i in held]
    t0 = time.perf_counter()
    try:
        zs = np.asarray(await engine.score_labels([zero.prompt(q) for q in texts], labels))
        fs = np.asarray(await engine.score_labels([few.prompt(q) for q in texts], labels))
        cf = np.asarray(await engine.score_labels([few.prompt(CONTENT_FREE)], labels))[0]
        zcf = np.asarray(await engine.score_labels([zero.prompt(CONTENT_FREE)], labels))[0]
    finally:
        await engine.aclose()
    took = time.perf_counter() - t0

    def acc(scores: np.ndarray) -> dict[str, object]:
        picks = [labels[int(j)] for j in np.argmax(scores, axis=1)]
        k = sum(p == t for p, t in zip(picks, truth, strict=True))
        return _ci(k, len(truth)) | {"answers": dict(Counter(picks).most_common())}

    calibrated = log_softmax(fs, axis=1) - log_softmax(cf)
    zero_cal = log_softmax(zs, axis=1) - log_softmax(zcf)
    label, count = Counter(truth).most_common(1)[0]
    return {
        "dataset": name,
        "labels": labels,
        "queries": len(truth),
        "exemplars": exemplars,
        "seconds": round(took, 1),
        "majority": _ci(count, len(truth)) | {"label": label},
        "zero-shot": acc(zs),
        "zero-shot calibrated": acc(zero_cal),
        "few-shot": acc(fs),
        "few-shot calibrated": acc(calibrated),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="news-mini,bbc-news")
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--exemplars", type=int, default=8)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        out = asyncio.run(measure(name, args.queries, args.exemplars, args.seed))
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
