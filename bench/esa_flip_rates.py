"""Can a canary change ESA's clean partition outputs on the bundled model? (issue 14, ESA)

An ESA audit sees the canary only if the canary's partition answers differently with (C1)
and without (C0) it, and a black-box audit only if the zero-shot candidates hold the signal
texts y1, y0 (the release is always a candidate). This benchmark starts a real
``dpicl serve`` (transformers engine, bundled SmolLM2-135M on CPU, ``DPICL_WHITEBOX=internal``,
SQLite in a temp dir) and, for each design, draws ``--pairs`` neighbour pairs exactly as the
auditor builds them (``build_generation_design``, seed = pair index + ``--seed``), then:

* asks ``/v1/debug/generate`` once per world on contexts at temperature 0 (greedy: the
  partition outputs are then a function of the prompt) and counts a *flip* when the
  partition outputs differ between C1 and C0, *toward* when C1 has more partitions answering
  y1 than C0 (an answer "is" y1 when its first line is y1 for the identical design, the
  whole text otherwise, as the audit decides);
* for the first ``--candidate-pairs`` pairs, asks once more on C0 at temperature 1.0 (the
  server's ESA default; ``--candidates`` zero-shot candidates) and counts the candidates that
  are y1 or y0 (what a black-box audit needs).

A partition "answered y" when its signal text is y or y cut short by ``max_tokens`` (a prefix
of at least 8 characters).

Designs: ``identical`` (every partition holds one made-up text x, the canary partition
(x, y1) against (x, y0), y1/y0 made-up three-word phrases named in the template),
``pivotal`` (Prompt 3 naming a dialogue x and the clock/foxborough pair; pinned partitions
hold x or other dialogues) and ``paper`` (paper 000's design, 2 dialogues per partition).
Flip rates come with two-sided 95% Clopper-Pearson intervals.

    nice -n 10 .venv/bin/python bench/esa_flip_rates.py --pairs 12 --port 18150
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from scipy import stats

from dpicl_audit.datasets import load_dataset
from dpicl_audit.demo.servers import DemoServer  # a `dpicl serve` subprocess, white-box internal
from dpicl_audit.mechanisms.esa.audit import ESA
from dpicl_audit.mechanisms.esa.build import build_generation_design
from dpicl_audit.mechanisms.esa.design import GenerationDesign
from dpicl_audit.plan import AuditPlan

ADMIN = "bench-admin-token"


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """Two-sided 95% Clopper-Pearson interval of k successes in n."""
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def _plan(design: str, seed: int, partitions: int, candidates: int, tokens: int) -> AuditPlan:
    return AuditPlan.from_sources(
        None,
        {
            "mechanism.name": "esa",
            "design": design,
            "seed": seed,
            "mechanism.partitions": partitions,
            "mechanism.candidates": candidates,
            "mechanism.max_tokens": tokens,
            "mechanism.epsilons": [8.0],
        },
    )


def _ask(
    c: httpx.Client, plan: AuditPlan, d: GenerationDesign, world: int, temperature: float
) -> dict[str, Any]:
    body = ESA.context_body(d, plan, 8.0, world, name=f"flip-{world}")
    body["mechanism"]["temperature"] = temperature
    if temperature == 0.0:
        body["mechanism"]["candidates"] = 1  # greedy candidates are all the same text
    r = c.post("/v1/contexts", json=body)
    r.raise_for_status()
    ctx = r.json()["id"]
    try:
        out = c.post(
            "/v1/debug/generate",
            json={"context_id": ctx, "query": d.query, "max_tokens": plan.mechanism.max_tokens},
        )
        out.raise_for_status()
        return dict(out.json())
    finally:
        c.delete(f"/v1/contexts/{ctx}")


def _is(d: GenerationDesign, text: str, y: str) -> bool:
    """Whether a partition answered ``y``: its signal text equals y, or is y cut short by
    max_tokens (a prefix of at least 8 characters)."""
    s = d.signal_text(text)
    return s == y or (len(s) >= 8 and y.startswith(s))


def measure(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=900) as c:
        for name in args.designs.split(","):
            flips = toward = cand_hits = cand_total = both = cand_pairs = 0
            examples: list[dict[str, Any]] = []
            t0 = time.monotonic()
            for i in range(args.pairs):
                plan = _plan(name, args.seed + i, args.partitions, args.candidates, args.tokens)
                d = build_generation_design(plan, load_dataset(plan.dataset))
                p1 = _ask(c, plan, d, 1, 0.0)["partition_texts"]
                p0 = _ask(c, plan, d, 0, 0.0)["partition_texts"]
                n1 = sum(_is(d, t, d.y1) for t in p1)
                n0 = sum(_is(d, t, d.y1) for t in p0)
                flips += p1 != p0
                toward += n1 > n0
                if i >= args.candidate_pairs:
                    continue
                cands = [str(x) for x in _ask(c, plan, d, 0, 1.0)["candidates"]]
                sig = [d.signal_text(x) for x in cands]
                cand_hits += sum(s in (d.y1, d.y0) for s in sig)
                cand_total += len(sig)
                cand_pairs += 1
                both += d.y1 in sig and d.y0 in sig
                if i < 2:
                    examples.append({"y1": d.y1, "y0": d.y0, "c1": p1, "c0": p0, "cands": cands})
            lo, hi = clopper_pearson(flips, args.pairs)
            row = {
                "design": name,
                "pairs": args.pairs,
                "flips": flips,
                "ci95": [lo, hi],
                "toward_canary": toward,
                "candidate_signal_hits": cand_hits,
                "candidates": cand_total,
                "queries_with_both_signals": both,
                "candidate_queries": cand_pairs,
                "seconds": time.monotonic() - t0,
                "examples": examples,
            }
            rows.append(row)
            print(
                f"{name:10s} flips {flips}/{args.pairs} (95% CI [{lo:.2f}, {hi:.2f}]), toward "
                f"the canary {toward}; candidates that are y1/y0: {cand_hits}/{cand_total}, "
                f"queries with both: {both}/{cand_pairs} ({row['seconds']:.0f} s)",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=12, help="neighbour pairs per design")
    p.add_argument("--designs", default="identical,pivotal,paper")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--tokens", type=int, default=12, help="max_tokens per answer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--candidate-pairs", type=int, default=3, help="pairs that also sample candidates"
    )
    p.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error("--pairs must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        srv = DemoServer("transformers", Path(tmp), ADMIN, "bench-key")
        if args.port is not None:
            srv.port = args.port
        srv.start()
        try:
            health = srv.wait_ready(600)
            print(f"server: engine={health['engine']} model={health['model']}", flush=True)
            rows = measure(srv.url, args)
        finally:
            srv.stop()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
