"""Does ESA's black-box release over real HTTP follow its closed form? (docs/auditing.md,
"ESA: the balanced design")

Runs the real-query black-box audit of ``tests/e2e/test_esa_pivotal_oracle.py`` (oracle engine,
the real MiniLM embedder, ``DPICL_WHITEBOX=off``, balanced design, T = 3, epsilon 8, 8 zero-shot
candidates) against the real app under uvicorn (a thread of this process, real HTTP), with a
*recorder* around the server's ESA pipeline. The mechanism is unchanged: the recorder only
keeps, per request, the context, the partition texts, the zero-shot candidates, the released
index, the clean and noisy means, and the embeddings of the texts seen.

Then, per world, it checks the chain that the closed form

    P(y1) = 2^-Tc + (1 - 2^(1 - Tc)) Phi(g D / (2 T sigma))      (mechanisms.esa.build)

rests on, link by link:

* the auditor's trial log against the server's requests (one request per trial, each world's
  trials on its own context, the same releases: no retried, dropped or misassigned trial);
* the partition texts (the design's ``[y1, y1, y0]`` / ``[y1, y0, y0]``), the embeddings (one
  per text: the server's e(y1), e(y0) and D);
* the number k of y1 candidates against Binomial(Tc, 1/2) (chi-square);
* the noise's projection on u = (e1 - e0) / D over sigma against N(0, 1) (mean, sd, KS);
* the release given 1 <= k < Tc against Phi(g D / (2 T sigma)) (chi-square over k: "selection
  given the candidates"), and the rate of every trial against the closed form (z, binomial test).

With ``--runs`` > 1 every run gets fresh server randomness; the report pools them.

    nice -n 10 .venv/bin/python bench/esa_release_check.py --trials 2000 --runs 3 --port 18400
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import math
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import special, stats

import dpicl.mechanisms.esa.pipeline as esa_pipeline
from dpicl.mechanisms.esa.release import EsaRelease
from dpicl.mechanisms.esa.release import esa_release as honest_release
from dpicl_audit.mechanisms.esa.design import signal_pair
from dpicl_audit.pipeline.run import run_audit
from dpicl_audit.plan import AuditPlan

# The test servers' helpers (tokens, settings, in-thread uvicorn), from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import ThreadServer, target_plan


@dataclass(frozen=True, slots=True)
class Request:
    """One ESA request as the server handled it."""

    context_id: str
    parts: list[str]
    cands: list[str]
    index: int
    clean: np.ndarray
    noisy: np.ndarray
    sigma: float


class Recorder:
    """Wraps the server's ESA pipeline (module globals looked up per call) and records."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.embeddings: dict[str, np.ndarray] = {}
        self.max_spread = 0.0  # largest distance between two embeddings of one text
        self._current: contextvars.ContextVar[tuple[str, list[str], list[str]]] = (
            contextvars.ContextVar("esa_request")
        )
        self._lock = threading.Lock()

    def install(self) -> None:
        generate_and_embed = esa_pipeline._generate_and_embed

        async def recording_generate(*args: Any) -> Any:
            out = await generate_and_embed(*args)
            part_texts, cand_texts, part_emb, cand_emb = out
            context = args[2]
            with self._lock:
                for text, row in zip(
                    [*part_texts, *cand_texts], [*part_emb, *cand_emb], strict=True
                ):
                    seen = self.embeddings.setdefault(text, np.array(row, dtype=np.float64))
                    self.max_spread = max(self.max_spread, float(np.linalg.norm(seen - row)))
            self._current.set((context.id, list(part_texts), list(cand_texts)))
            return out

        def recording_release(
            partition_embeddings: npt.NDArray[np.float64],
            candidate_embeddings: npt.NDArray[np.float64],
            sigma: float,
            rng: np.random.Generator,
        ) -> EsaRelease:
            rel = honest_release(partition_embeddings, candidate_embeddings, sigma, rng)
            cid, parts, cands = self._current.get()
            with self._lock:
                self.requests.append(
                    Request(cid, parts, cands, rel.index, rel.clean_mean, rel.noisy_mean, sigma)
                )
            return rel

        esa_pipeline._generate_and_embed = recording_generate  # type: ignore[assignment]
        esa_pipeline.esa_release = recording_release  # type: ignore[attr-defined]


def audit_plan(url: str, trials: int, seed: int, concurrency: int) -> AuditPlan:
    """The plan of tests/e2e/test_esa_pivotal_oracle.py's real-query test."""
    return target_plan(
        url,
        **{
            "mechanism.name": "esa",
            "mechanism.epsilons": [8.0],
            "mechanism.partitions": 3,
            "trials": trials,
            "seed": seed,
            "concurrency": concurrency,
            # The probes whose answers probe_answers counts: the check is that every request
            # the server answers is a trial's or one of theirs (limits and switches, issue
            # 44, are left out: this bench checks the release, not the surface).
            "probes": ["ledger", "calibration", "parameters", "surface", "tails"],
        },
    )


def trial_log(db: Path) -> list[tuple[int, int, str, int]]:
    """(trial index, world, context id, decision) of every logged trial."""
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT trial_index, world, context_id, decision FROM trials ORDER BY trial_index"
        ).fetchall()
    return [(int(i), int(w), str(c), int(d)) for i, w, c, d in rows]


def chi2_pooled(
    observed: npt.ArrayLike, expected: npt.ArrayLike, min_expected: float = 5.0
) -> tuple[float, int]:
    """Pearson's chi-square with adjacent bins merged until each expects >= ``min_expected``
    (the binomial's sparse tails); returns (statistic, degrees of freedom)."""
    bins: list[list[float]] = []
    acc_o = acc_e = 0.0
    for o, e in zip(np.ravel(observed), np.ravel(expected), strict=True):
        acc_o, acc_e = acc_o + float(o), acc_e + float(e)
        if acc_e >= min_expected:
            bins.append([acc_o, acc_e])
            acc_o = acc_e = 0.0
    if acc_e > 0.0 and bins:
        bins[-1][0] += acc_o
        bins[-1][1] += acc_e
    return sum((o - e) ** 2 / e for o, e in bins), len(bins) - 1


def check_world(
    reqs: Sequence[Request], world: int, y1: str, e1: np.ndarray, e0: np.ndarray, tc: int, t: int
) -> dict[str, Any]:
    """The closed form's links for one world's requests (module docstring)."""
    n = len(reqs)
    d = float(np.linalg.norm(e1 - e0))
    u, mid = (e1 - e0) / d, (e1 + e0) / 2.0
    sigma = reqs[0].sigma
    k = np.array([sum(c == y1 for c in r.cands) for r in reqs])
    rel = np.array([int(r.cands[r.index] == y1) for r in reqs])
    gaps = sorted({2 * sum(p == y1 for p in r.parts) - t for r in reqs})
    (g,) = gaps  # every request of a world has the design's clean gap
    noise = np.array([float((r.noisy - r.clean) @ u) for r in reqs]) / sigma
    p_mix = float(special.ndtr(g * d / (2 * t * sigma)))
    p = 2.0**-tc + (1.0 - 2.0 ** (1 - tc)) * p_mix
    counts = np.bincount(k, minlength=tc + 1)
    expected = n * stats.binom.pmf(np.arange(tc + 1), tc, 0.5)
    chi_k, df_k = chi2_pooled(counts, expected)
    chi_sel, per_k = 0.0, {}
    for j in range(1, tc):
        s = k == j
        if s.any():
            nk, ok = int(s.sum()), int(rel[s].sum())
            chi_sel += (ok - nk * p_mix) ** 2 / (nk * p_mix * (1.0 - p_mix))
            per_k[j] = [nk, ok / nk]
    mixed = (k > 0) & (k < tc)
    hits = int(rel.sum())
    return {
        "world": world,
        "requests": n,
        "gap": g,
        "D": d,
        "sigma": sigma,
        "k_counts": counts.tolist(),
        "k_mean": float(k.mean()),
        "k_chi2": chi_k,
        "k_chi2_p": float(stats.chi2.sf(chi_k, df_k)),
        "noise_mean": float(noise.mean()),
        "noise_sd": float(noise.std(ddof=1)),
        "noise_ks_p": float(stats.kstest(noise, "norm").pvalue),
        "release_is_side_of_midpoint": float(
            np.mean(rel[mixed] == (np.array([float((r.noisy - mid) @ u) for r in reqs])[mixed] > 0))
        ),
        "p_given_k": per_k,
        "p_mixed_predicted": p_mix,
        "p_mixed_observed": float(rel[mixed].mean()),
        "selection_chi2": chi_sel,
        "selection_chi2_p": float(stats.chi2.sf(chi_sel, len(per_k))),
        "p_predicted": p,
        "p_observed": hits / n,
        "z": (hits / n - p) / math.sqrt(p * (1.0 - p) / n),
        "binomial_p": float(stats.binomtest(hits, n, p).pvalue),
    }


def probe_answers(results: Mapping[str, Any]) -> int:
    """The answers of the audit's probes from outside, each on contexts of its own: the ledger
    probe and its bursts (dpicl_audit.probes.ledger, .ledger_burst), the client parameters'
    sweep (.parameters), every route's whole response (.surface) and voting's noise tails
    (dpicl_audit.probes.tails; the calibration scan asks none). With the trials',
    they are every request the server answers in a run."""
    ledger = results.get("ledger") or {}
    bursts = (ledger.get("bursts") or {}).get("routes") or []
    variants = (results.get("parameters") or {}).get("variants") or []
    routes = (results.get("surface") or {}).get("routes") or []
    return (
        int(ledger.get("answers") or 0)
        + sum(int(b.get("answered") or 0) for b in bursts)
        + sum(sum((v.get("labels") or {}).values()) for v in variants)
        + sum(sum((v.get("screening") or {}).values()) for v in variants)
        + sum(int(r.get("answered") or 0) for r in routes)
        + int((results.get("tails") or {}).get("answers") or 0)
    )


def one_run(
    recorder: Recorder, work: Path, port: int, trials: int, seed: int, concurrency: int
) -> tuple[list[Request], dict[str, Any]]:
    """One audit against a fresh server database; its requests and its trial-log checks."""
    work.mkdir(parents=True, exist_ok=True)
    start = len(recorder.requests)
    with ThreadServer(work / "server.db", whitebox="off", port=port) as app:
        plan = audit_plan(app.url, trials, seed, concurrency)
        t0 = time.monotonic()
        results = asyncio.run(run_audit(plan, db=work / "audit.db", out_dir=work, progress=False))
        wall = time.monotonic() - t0
    reqs = recorder.requests[start:]
    log = trial_log(work / "audit.db")
    world_of = {c: w for _, w, c, _ in log}
    by_context = {w: [r for r in reqs if world_of.get(r.context_id) == w] for w in (1, 0)}
    (s,) = results["settings"]
    bb = s["black_box"]
    y1 = signal_pair(plan)[1]
    probe = probe_answers(results)
    checks = {
        "trials_logged": len(log),
        "server_requests": len(reqs),
        "probe_answers": probe,
        "unknown_context_requests": sum(1 for r in reqs if r.context_id not in world_of) - probe,
        "one_context_per_world": len(set(world_of)) == 2 and set(world_of.values()) == {0, 1},
        # Each world's releases in the log equal those the server made on its context.
        "log_matches_server": all(
            sum(d for _, w2, _, d in log if w2 == w)
            == sum(int(r.cands[r.index] == y1) for r in by_context[w])
            and sum(1 for _, w2, _, _ in log if w2 == w) == len(by_context[w])
            for w in (1, 0)
        ),
        "tpr": bb["tpr"],
        "fpr": bb["fpr"],
        "release_rates": s["release_rates"],
        "epsilon_lower": bb["epsilon_lower"],
        "wall_s": wall,
    }
    return [r for w in (1, 0) for r in by_context[w]], checks | {"world_of": world_of}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=3, help="the first run's plan seed (the test's)")
    ap.add_argument("--same-seed", action="store_true", help="every run with --seed")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)

    # The signal texts and mechanism settings every run shares (the runs differ in their seed).
    plan = audit_plan(f"http://127.0.0.1:{args.port}", args.trials, args.seed, args.concurrency)
    recorder = Recorder()
    recorder.install()
    worlds: dict[int, list[Request]] = {1: [], 0: []}
    runs = []
    with tempfile.TemporaryDirectory(prefix="esa-release-check-") as tmp:
        for i in range(args.runs):
            seed = args.seed if args.same_seed else args.seed + i
            reqs, checks = one_run(
                recorder, Path(tmp) / f"run{i}", args.port + i, args.trials, seed, args.concurrency
            )
            world_of = checks.pop("world_of")
            for r in reqs:
                worlds[world_of[r.context_id]].append(r)
            runs.append({"seed": seed} | checks)
            print(json.dumps(runs[-1]), flush=True)
    _, y1, y0 = signal_pair(plan)
    e1, e0 = recorder.embeddings[y1], recorder.embeddings[y0]
    tc, t = plan.mechanism.candidates, plan.mechanism.partitions
    checked = [check_world(worlds[w], w, y1, e1, e0, tc, t) for w in (1, 0)]
    report = {
        "runs": runs,
        "texts_seen": sorted(recorder.embeddings),
        "max_embedding_spread": recorder.max_spread,
        "worlds": checked,
    }
    for w in checked:
        print(
            f"C{w['world']}: n {w['requests']}, P(y1) {w['p_observed']:.4f} against "
            f"{w['p_predicted']:.4f} (z {w['z']:+.2f}); k ~ Bin({tc}, "
            f"1/2): mean {w['k_mean']:.3f}, chi2 p {w['k_chi2_p']:.3f}; noise/sigma mean "
            f"{w['noise_mean']:+.4f} sd {w['noise_sd']:.4f} KS p {w['noise_ks_p']:.3f}; given "
            f"mixed candidates {w['p_mixed_observed']:.4f} against {w['p_mixed_predicted']:.4f},"
            f" chi2 over k p {w['selection_chi2_p']:.3f}"
        )
    print(
        f"texts seen {len(recorder.embeddings)}, one embedding per text: "
        f"{recorder.max_spread == 0.0}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
