"""Clean-vote flip rates of voting-audit designs on the bundled model (issue 14, item 4).

An audit of private voting can only see the canary when the canary changes a *clean* vote:
if the partition's answer is the same with (C1) and without (C0) the canary, the two worlds
release the same distribution and no attack has any power. This benchmark starts a real
``dpicl serve`` (transformers engine, bundled SmolLM2-135M on CPU, ``DPICL_WHITEBOX=internal``,
SQLite in a temp dir), and for each design draws ``--pairs`` neighbour pairs, asks
``/v1/debug/classify`` once per world and counts the pairs whose clean vote histograms differ.
It prints each design's flip rate with its two-sided 95% Clopper-Pearson interval, and the
measured run time.

Designs (texts from the bundled news-mini corpus; epsilon is irrelevant to clean votes):

* ``identical-natural``: one exemplar per partition, all partitions hold the same news text
  x; the canary partition holds (x, A) in C1 and (x, B) in C0, the other T - 1 are pinned so
  the canary is pivotal (T = 4: A, A, B); minimal template ``{exemplars}\\n\\nInput: {query}
  \\nLabel:``; labels A/B; the query is x.
* ``identical-random``: the same with x a random string of made-up words.
* ``identical-wordlabels``: ``identical-random`` with two made-up words as the labels (no
  prior of the model favours either); ``identical-natural-wordlabels``: the same with a news
  text as x.
* ``identical-deployment``: the same with the server's default (deployment) template and the
  corpus's own labels (World/Sports) in place of A/B.
* ``inquery-natural``: the current default (paper 000, Prompt 1: text verification, Yes/No,
  T = 4 partitions of 2 exemplars with seeded Yes/No outputs, natural canary, query = the
  canary's text).
* ``inquery-random``: the same with a random-string canary.
* ``deployment-natural``: the server's default template and the corpus labels, membership
  query "is the text ... present" naming two labels.
* ``brainwash``: Prompt 4 (classification) with the canary injected six times in the query
  under a wrong label (Wen et al.), canary natural.

    nice -n 10 .venv/bin/python bench/flip_rates.py [--pairs 40] [--designs a,b] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from scipy import stats

from dpicl_audit.datasets import load_dataset
from dpicl_audit.demo.servers import DemoServer  # a `dpicl serve` subprocess, white-box internal
from dpicl_audit.prompts import (
    AUDIT_TEMPLATE,
    CLASSIFY_TEMPLATE,
    audit_query,
    brainwash_query,
    deployment_query,
)

ADMIN = "bench-admin-token"
MINIMAL_TEMPLATE = "{exemplars}\n\nInput: {query}\nLabel:"
SYLLABLES = ("ka", "zu", "mor", "vel", "tri", "qua", "son", "lix", "bre", "dov", "fen", "gro")


@dataclass(frozen=True)
class Pair:
    """One neighbour pair: C1/C0 exemplars (same order), labels, template, query."""

    labels: list[str]
    template: str | None
    with_canary: list[dict[str, str]]
    without_canary: list[dict[str, str]]
    query: str
    partitions: int


def _random_text(rng: np.random.Generator, words: int = 7) -> str:
    out = [
        "".join(SYLLABLES[int(i)] for i in rng.integers(0, len(SYLLABLES), int(rng.integers(2, 4))))
        for _ in range(words)
    ]
    return " ".join(out).capitalize() + "."


def _identical(x: str, labels: list[str], template: str | None, t: int = 4) -> Pair:
    a, b = labels[0], labels[1]
    others = [a] * (t // 2) + [b] * (t - 1 - t // 2)  # T = 4: A, A, B -> C1 [3, 1], C0 [2, 2]
    rest = [{"input": x, "output": lab} for lab in others]
    return Pair(
        labels=labels,
        template=template,
        with_canary=[{"input": x, "output": a}, *rest],
        without_canary=[{"input": x, "output": b}, *rest],
        query=x,
        partitions=t,
    )


class Designs:
    """Pair builders; each draws its texts from ``rng``."""

    def __init__(self, seed: int) -> None:
        self.data = load_dataset("news-mini")
        self.texts = [e.input for e in self.data.examples]
        self.rng = np.random.default_rng(seed)
        two = [lab for lab in self.data.labels][:2]
        self.two_labels = two

    def _texts(self, k: int) -> list[str]:
        return [self.texts[int(i)] for i in self.rng.choice(len(self.texts), size=k, replace=False)]

    def identical_natural(self) -> Pair:
        return _identical(self._texts(1)[0], ["A", "B"], MINIMAL_TEMPLATE)

    def identical_random(self) -> Pair:
        return _identical(_random_text(self.rng), ["A", "B"], MINIMAL_TEMPLATE)

    def _word_labels(self) -> list[str]:
        # Made-up single-word labels: no prior of the model favours either answer.
        a, b = (_random_text(self.rng, 1).rstrip(".") for _ in range(2))
        while b == a:
            b = _random_text(self.rng, 1).rstrip(".")
        return [a, b]

    def identical_wordlabels(self) -> Pair:
        labels = self._word_labels()
        return _identical(_random_text(self.rng), labels, MINIMAL_TEMPLATE)

    def identical_natural_wordlabels(self) -> Pair:
        labels = self._word_labels()
        return _identical(self._texts(1)[0], labels, MINIMAL_TEMPLATE)

    def identical_deployment(self) -> Pair:
        return _identical(self._texts(1)[0], list(self.two_labels), None)

    def _inquery(self, canary: str) -> Pair:
        others = self._texts(8)
        outs = ["Yes" if c else "No" for c in self.rng.integers(0, 2, size=8)]
        c0 = [{"input": t, "output": o} for t, o in zip(others, outs, strict=True)]
        pos = int(self.rng.integers(8))
        c1 = list(c0)
        c1[pos] = {"input": canary, "output": c0[pos]["output"]}  # natural: replacement's label
        return Pair(["Yes", "No"], AUDIT_TEMPLATE, c1, c0, audit_query(canary), 4)

    def inquery_natural(self) -> Pair:
        return self._inquery(self._texts(1)[0])

    def inquery_random(self) -> Pair:
        return self._inquery(_random_text(self.rng))

    def _labelled(self, k: int) -> list[dict[str, str]]:
        idx = self.rng.choice(len(self.data.examples), size=k, replace=False)
        return [
            {"input": self.data.examples[int(i)].input, "output": self.data.examples[int(i)].output}
            for i in idx
        ]

    def _replace_one(self) -> tuple[dict[str, str], list[dict[str, str]], list[dict[str, str]]]:
        """A natural canary with its label, and C1/C0 of 8 labelled examples (canary at a
        random position of C1, the replacement there in C0)."""
        ex = self._labelled(9)
        canary, c0 = ex[0], ex[1:]
        c1 = list(c0)
        c1[int(self.rng.integers(8))] = canary
        return canary, c1, c0

    def deployment_natural(self) -> Pair:
        canary, c1, c0 = self._replace_one()
        labels = list(self.data.labels)
        query = deployment_query(canary["input"], labels[0], labels[1])
        return Pair(labels, None, c1, c0, query, 4)

    def brainwash(self) -> Pair:
        canary, c1, c0 = self._replace_one()
        labels = list(self.data.labels)
        wrong = next(lab for lab in labels if lab != canary["output"])
        return Pair(labels, CLASSIFY_TEMPLATE, c1, c0, brainwash_query(canary["input"], wrong), 4)


DESIGNS: dict[str, Callable[[Designs], Pair]] = {
    "identical-natural": Designs.identical_natural,
    "identical-random": Designs.identical_random,
    "identical-wordlabels": Designs.identical_wordlabels,
    "identical-natural-wordlabels": Designs.identical_natural_wordlabels,
    "identical-deployment": Designs.identical_deployment,
    "inquery-natural": Designs.inquery_natural,
    "inquery-random": Designs.inquery_random,
    "deployment-natural": Designs.deployment_natural,
    "brainwash": Designs.brainwash,
}


def _clean_votes(c: httpx.Client, pair: Pair, exemplars: list[dict[str, str]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task": "classification",
        "labels": pair.labels,
        "exemplars": exemplars,
        "mechanism": {
            "name": "voting",
            "epsilon": 8.0,
            "partitions": pair.partitions,
            "partition_seed": 1,
            "partitioning": "positional",
        },
    }
    if pair.template is not None:
        body["template"] = pair.template
    r = c.post("/v1/contexts", json=body)
    r.raise_for_status()
    ctx = r.json()["id"]
    try:
        out = c.post("/v1/debug/classify", json={"context_id": ctx, "query": pair.query})
        out.raise_for_status()
        return dict(out.json())
    finally:
        c.delete(f"/v1/contexts/{ctx}")


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """Two-sided 95% Clopper-Pearson interval of k successes in n."""
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def measure(url: str, names: list[str], pairs: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=600) as c:
        for name in names:
            designs = Designs(seed)
            flips = follow = 0
            t0 = time.monotonic()
            for _ in range(pairs):
                pair = DESIGNS[name](designs)
                v1 = _clean_votes(c, pair, pair.with_canary)["clean_votes"]
                v0 = _clean_votes(c, pair, pair.without_canary)["clean_votes"]
                flips += v1 != v0
                follow += v1.get(pair.labels[0], 0) > v0.get(pair.labels[0], 0)
            lo, hi = clopper_pearson(flips, pairs)
            rows.append(
                {
                    "design": name,
                    "flips": flips,
                    "toward_canary": follow,
                    "pairs": pairs,
                    "rate": flips / pairs,
                    "ci95": [lo, hi],
                    "seconds": time.monotonic() - t0,
                }
            )
            r = rows[-1]
            print(
                f"{name:22s} {flips:3d}/{pairs:<3d} = {r['rate']:.2f}  95% CI [{lo:.2f}, {hi:.2f}]"
                f"  (first label gained votes in {follow}; {r['seconds']:.0f} s)",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=40, help="neighbour pairs per design")
    p.add_argument("--designs", default=",".join(DESIGNS), help="comma-separated design names")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.designs.split(",") if n.strip()]
    unknown = [n for n in names if n not in DESIGNS]
    if unknown or args.pairs < 1:
        p.error(f"unknown designs {unknown} (known: {list(DESIGNS)}) or --pairs < 1")
    with tempfile.TemporaryDirectory() as tmp:
        srv = DemoServer("transformers", Path(tmp), ADMIN, "bench-key").start()
        try:
            health = srv.wait_ready(600)
            print(f"server: engine={health['engine']} model={health['model']}", flush=True)
            rows = measure(srv.url, names, args.pairs, args.seed)
        finally:
            srv.stop()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
