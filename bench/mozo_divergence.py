"""White-box study: DPS-MOZO's exact per-token, per-shot Renyi divergences on the bundled model.

Starts a real ``dpicl serve`` (transformers engine, bundled SmolLM2, DPICL_WHITEBOX=internal)
as a subprocess, creates a DPS-MOZO context of bundled dialogues (dialogsum-mini), asks
``/v1/debug/generate`` a few summarisation queries and collects, for every generated token
and every sampled shot, the server's exact divergence (both directions at alpha) between the
released product distribution P and the product P_i with that shot replaced by the
zero-shot distribution.

Compared with:

* ``beta * alpha`` (the per-shot radius of Line 13): under the additivity the proof assumes
  (Lemma B.2), swapping one factor of the product moves the output by at most the factor's
  own divergence, i.e. ``D(P || P_i) <= D(mixed_i || zero) <= beta * alpha``;
* ``4 * beta * alpha`` (Theorem B.3's per-token bound for two neighbouring datasets: two
  such steps through the weak triangle inequality).

Exceeding ``beta * alpha`` shows the normalised product is *not* additive on real logits;
exceeding ``4 * beta * alpha`` would show the claimed per-token bound failing even on the
half-way neighbour (the zero-shot replacement). Not exceeding them on these samples proves
nothing about the worst case (tests pin a counterexample; docs/privacy.md).

    .venv/bin/python bench/mozo_divergence.py [--queries 3] [--max-tokens 24]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from dpicl_audit.demo.servers import DemoServer  # a `dpicl serve` subprocess, white-box internal

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "auditor" / "dpicl_audit" / "data" / "dialogsum_mini.jsonl"
ADMIN = "bench-admin-token"
TEMPLATE = "Summarise the dialogue in one sentence.\n\n{exemplars}\n\nInput: {query}\nOutput:"


def load_dialogues() -> list[dict[str, str]]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return [{"input": r["input"], "output": r["output"]} for r in rows]


def study(url: str, *, epsilons: list[float], n_ctx: int, queries: int, t_max: int) -> None:
    data = load_dialogues()
    exemplars, tests = data[:n_ctx], data[n_ctx : n_ctx + queries]
    h = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=url, headers=h, timeout=600) as c:
        health = c.get("/healthz").json()
        print(
            f"server: engine={health['engine']} model={health['model']} "
            f"whitebox={health['whitebox']}"
        )
        for eps in epsilons:
            body: dict[str, Any] = {
                "task": "generation",
                "exemplars": exemplars,
                "template": TEMPLATE,
                "mechanism": {
                    "name": "dps-mozo",
                    "guarantee": "paper",  # this study measures the paper's nominal mode
                    "epsilon": eps,
                    "n_shots": 4,
                    "top_k": 100,
                    "max_tokens": t_max,
                    "queries": queries,
                },
            }
            r = c.post("/v1/contexts", json=body)
            if r.status_code != 201:
                raise SystemExit(f"context refused: {r.status_code} {r.text}")
            info = r.json()
            m = info["mechanism"]
            alpha, beta = int(m["alpha"]), float(m["beta"])
            radius, bound = beta * alpha, 4 * beta * alpha
            exact: list[float] = []  # max over the two directions, per (token, shot)
            reached: list[float] = []  # max(D(mixed||zero), D(zero||mixed)) per (token, shot)
            lambdas: list[float] = []
            t0 = time.perf_counter()
            n_tok = 0
            for q in tests:
                out = c.post(
                    "/v1/debug/generate", json={"context_id": info["id"], "query": q["input"]}
                )
                out.raise_for_status()
                d = out.json()
                for tok in d["tokens"]:
                    n_tok += 1
                    exact.extend(max(pair) for pair in tok["exact_divergences"])
                    reached.extend(max(pair) for pair in tok["divergences"])
                    lambdas.extend(tok["lambdas"])
                print(f"  eps={eps:g} query: {q['input'][:60]!r}\n    -> {d['text'].strip()!r}")
            dt = time.perf_counter() - t0
            e = np.asarray(exact)
            print(
                f"eps={eps:g} delta={m['delta']:.3g} alpha={alpha} beta={beta:.5f} "
                f"q={m['sample_rate']:.3f}: radius beta*alpha={radius:.4f}, "
                f"4*beta*alpha={bound:.4f}; {n_tok} tokens x 4 shots = {e.size} samples "
                f"in {dt:.1f} s"
            )
            print(
                f"  reached per-shot constraint: max {max(reached):.4f} (<= radius: "
                f"{max(reached) <= radius * (1 + 1e-6)}); lambda median "
                f"{np.median(lambdas):.3f}, share at 1.5: {np.mean(np.isclose(lambdas, 1.5)):.2f}"
            )
            for name, ref in (("beta*alpha", radius), ("4*beta*alpha", bound)):
                ratio = e / ref
                print(
                    f"  exact/{name:<12}: max {ratio.max():.3f}  median {np.median(ratio):.3f}"
                    f"  p95 {np.quantile(ratio, 0.95):.3f}  fraction above 1: "
                    f"{np.mean(ratio > 1):.4f} ({int(np.sum(ratio > 1))}/{ratio.size})"
                )
            c.delete(f"/v1/contexts/{info['id']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0])
    ap.add_argument("--exemplars", type=int, default=32)
    ap.add_argument("--queries", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--url", default=None, help="use a running server (DPICL_WHITEBOX=internal)")
    args = ap.parse_args()
    if args.url:
        study(
            args.url,
            epsilons=args.epsilons,
            n_ctx=args.exemplars,
            queries=args.queries,
            t_max=args.max_tokens,
        )
        return
    with tempfile.TemporaryDirectory() as tmp:
        srv = DemoServer("transformers", Path(tmp), ADMIN, ADMIN).start()
        try:
            t0 = time.perf_counter()
            srv.wait_ready(300.0)
            print(f"server ready in {time.perf_counter() - t0:.1f} s")
            study(
                srv.url,
                epsilons=args.epsilons,
                n_ctx=args.exemplars,
                queries=args.queries,
                t_max=args.max_tokens,
            )
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
