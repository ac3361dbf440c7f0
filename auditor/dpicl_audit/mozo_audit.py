"""Black-box audit of DPS-MOZO (paper 004, Algorithm 1) over HTTP.

Design (audit-template setting, the auditor's own template):

* **Neighbours.** C1 holds the canary ``(x_c, y_1)`` at position ``i``; C0 holds the
  replacement ``(x_r, y_0)`` at the same position, everything else equal (replace-one; the
  exemplars' *outputs* are private). ``x_c`` asks which colour "is present" in record
  ``7F3Q``, quoting the two signal words (``"red"`` first, then ``"blue"``); ``y_1`` is signal
  1 (``red``). ``x_r`` asks the same about another record and ``y_0`` is signal 0
  (``blue``). The other exemplars are bundled dialogues (``dialogsum-mini``).
* **Audit query.** ``x_c`` itself. On the bundled SmolLM2 (both signals are single tokens,
  `` red`` and `` blue``) the canary's one-shot prompt shows ``Input: x_c / Output: red``
  right before ``Input: x_c / Output:``, so that shot pushes the first token to `` red``; in
  C0 the replacement's shot shows the same question answered ``blue``. The zero-shot prompt
  sees both words quoted in the question, so both are in its top-k (Line 5: tokens outside
  the zero-shot top-k can never be released). The query also follows the oracle
  simulator's membership rules (the word "present", the two quoted options, the canary's
  input verbatim in the query only in C1). **But on the oracle the audit measures about
  nothing**: DPS-MOZO runs on the oracle's *decoding sessions*, whose logits are
  pseudo-random hashes of the prompt text (docs/architecture.md), not on its rules, so the
  released text almost never starts with ``red`` in either world. Oracle runs check the
  plumbing, not the privacy.
* **Decision.** 1 when the released text (stripped) starts with signal 1, else 0.
* **Trials.** Each trial picks a world from a seeded schedule, and sends the audit query to
  a context of that world. A DPS-MOZO context answers only its configured ``queries``
  (``queries_per_context``, default 1) and is then ``budget_exhausted``, so the audit
  creates ``ceil(trials in world / queries_per_context)`` contexts per world and deletes
  them afterwards (``cleanup``).
* **Estimates.** One-sided Clopper-Pearson bounds on FPR and FNR (Bonferroni split), the GDP
  lower bound and its epsilon at the context's delta, and the classical bound
  (:func:`dpicl_audit.estimators.estimate_from_counts`). ``epsilon_emp`` is the larger of the
  GDP and classical lower bounds, each valid at the audit's confidence (one joint pair of
  intervals backs both).
* **Theory.** ``epsilon_theory`` is the context's configured epsilon: the paper's
  RDP-derived figure over all its ``queries`` answers. It is **nominal**: the per-token
  bound 4 beta alpha it rests on (Theorem B.3) is false (docs/privacy.md), so no exact
  epsilon exists to compare with and the verdict has no ``bug`` branch. With
  ``queries_per_context > 1`` one observation is a fraction of what the context releases,
  and ``epsilon_theory_per_answer`` (the server's ``cost.epsilon``) is reported beside it.

Trials are logged to the auditor's SQL trial log (:class:`dpicl_audit.store.TrialStore`,
setting ``mozo:eps=<epsilon>``) when a database is given; every created context is recorded
in the run's ``design`` (the log's ``run_contexts`` table holds one context per world, and
this audit uses many). There is no resume: a killed run is started again.

    python -m dpicl_audit.mozo_audit --url http://127.0.0.1:8000 --admin-token T \\
        --epsilon 8 --trials 200 [--db runs/audit.db]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import platform
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpicl_audit import __version__
from dpicl_audit.client import DpiclClient
from dpicl_audit.datasets import load_dataset
from dpicl_audit.errors import InvalidAuditInput, TargetError
from dpicl_audit.estimators import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    estimate_from_counts,
    per_interval_confidence,
)
from dpicl_audit.store import TrialRecord, TrialStore

__all__ = [
    "AUDIT_TEMPLATE",
    "SIGNALS",
    "MozoDesign",
    "audit_mozo",
    "decide",
    "main",
    "mozo_design",
    "world_schedule",
]

JSON = dict[str, Any]

SIGNALS: tuple[str, str] = ("red", "blue")
AUDIT_TEMPLATE = (
    "Answer with one word, as in the examples.\n\n{exemplars}\n\nInput: {query}\nOutput:"
)
_CANARY_RECORD = "7F3Q"
_REPLACEMENT_RECORD = "2K8M"
_TOL = 1e-9


def _question(record: str, signals: tuple[str, str]) -> str:
    s1, s0 = signals
    return f'Record {record}: which colour is present in this record, "{s1}" or "{s0}"?'


@dataclass(frozen=True, slots=True)
class MozoDesign:
    """The neighbour pair and the audit query."""

    exemplars_c1: tuple[JSON, ...]
    exemplars_c0: tuple[JSON, ...]
    position: int
    query: str
    signals: tuple[str, str]
    template: str

    def to_dict(self) -> JSON:
        return {
            "position": self.position,
            "query": self.query,
            "signals": list(self.signals),
            "template": self.template,
            "canary": self.exemplars_c1[self.position],
            "replacement": self.exemplars_c0[self.position],
            "n_exemplars": len(self.exemplars_c1),
        }


def mozo_design(
    n_exemplars: int = 4,
    *,
    seed: int = 0,
    signals: tuple[str, str] = SIGNALS,
    dataset: str = "dialogsum-mini",
    template: str = AUDIT_TEMPLATE,
) -> MozoDesign:
    """Replace-one neighbours: canary ``(x_c, signal 1)`` vs ``(x_r, signal 0)`` at one
    seeded position among ``n_exemplars - 1`` bundled filler exemplars."""
    if n_exemplars < 1:
        raise InvalidAuditInput(f"n_exemplars must be at least 1, got {n_exemplars}")
    s1, s0 = signals
    if not s1.strip() or not s0.strip() or s1.strip() == s0.strip():
        raise InvalidAuditInput(f"need two distinct non-empty signals, got {signals!r}")
    if s0.startswith(s1):
        raise InvalidAuditInput(f"signal 0 {s0!r} must not start with signal 1 {s1!r}")
    rng = np.random.default_rng(seed)
    fillers: list[JSON] = []
    if n_exemplars > 1:
        pool = load_dataset(dataset).examples
        if len(pool) < n_exemplars - 1:
            raise InvalidAuditInput(
                f"dataset {dataset!r} has {len(pool)} examples, fewer than {n_exemplars - 1}"
            )
        pick = rng.choice(len(pool), size=n_exemplars - 1, replace=False)
        fillers = [{"input": pool[int(j)].input, "output": pool[int(j)].output} for j in pick]
    position = int(rng.integers(n_exemplars))
    query = _question(_CANARY_RECORD, signals)
    canary = {"input": query, "output": s1}
    replacement = {"input": _question(_REPLACEMENT_RECORD, signals), "output": s0}
    c1 = [*fillers[:position], canary, *fillers[position:]]
    c0 = [*fillers[:position], replacement, *fillers[position:]]
    return MozoDesign(tuple(c1), tuple(c0), position, query, signals, template)


_LEADING = " \t\r\n\"'“‘`*("


def decide(text: str, signal1: str) -> int:
    """1 when the released text starts with signal 1, ignoring case and leading whitespace
    or quotes (the question quotes the signals, so a model may answer ``"red"``)."""
    return int(text.lstrip(_LEADING).casefold().startswith(signal1.casefold()))


def world_schedule(trials: int, seed: int) -> list[int]:
    """Each trial's world (1 = with the canary), fair coins from the run's seed."""
    rng = np.random.default_rng([seed, 0x4D4F5A4F])  # "MOZO": its own stream
    return [int(w) for w in rng.integers(0, 2, size=trials)]


def _verdict(epsilon_emp: float, epsilon_theory: float) -> JSON:
    violation = epsilon_emp > epsilon_theory * (1 + _TOL) + _TOL
    if violation:
        message = (
            f"PRIVACY VIOLATION: the audit proves epsilon >= {epsilon_emp:.3f} at its "
            f"confidence, above the configured (nominal) epsilon {epsilon_theory:g}"
        )
    else:
        message = (
            f"measured leakage (epsilon >= {epsilon_emp:.3f}) stays within the configured "
            f"nominal epsilon {epsilon_theory:g}; this cannot confirm the claim, whose "
            "per-token bound (Theorem B.3) is false"
        )
    return {
        "status": "violation" if violation else "ok",
        "violation": violation,
        "exceeds_exact": None,
        "message": message,
    }


async def audit_mozo(
    client: DpiclClient | None = None,
    *,
    base_url: str | None = None,
    admin_token: str | None = None,
    api_key: str | None = None,
    epsilon: float = 8.0,
    delta: float | None = 1e-5,
    alpha: int | None = None,
    trials: int = 200,
    n_exemplars: int = 4,
    n_shots: int | None = None,
    top_k: int = 100,
    max_tokens: int = 2,
    queries_per_context: int = 1,
    confidence: float = 0.95,
    seed: int = 0,
    signals: tuple[str, str] = SIGNALS,
    db: str | None = None,
    store: TrialStore | None = None,
    run_id: str | None = None,
    cleanup: bool = True,
    concurrency: int = 4,
    batch: int = 50,
) -> JSON:
    """Run the black-box DPS-MOZO audit; return the result dict (see module docstring).

    Give either ``client`` or ``base_url`` (with tokens). Trials go to ``store`` or to a
    :class:`TrialStore` at ``db`` when one is given; the result says where (``log``).
    """
    if trials < 2:
        raise InvalidAuditInput(f"trials must be at least 2, got {trials}")
    if queries_per_context < 1:
        raise InvalidAuditInput(f"queries_per_context must be >= 1, got {queries_per_context}")
    if batch < 1:
        raise InvalidAuditInput(f"batch must be >= 1, got {batch}")
    own_client = client is None
    if client is None:
        if base_url is None:
            raise InvalidAuditInput("give a client or a base_url")
        client = DpiclClient(
            base_url, admin_token=admin_token, api_key=api_key, concurrency=concurrency
        )
    own_store = store is None and db is not None
    if store is None and db is not None:
        store = TrialStore(db)
    run_id = run_id or f"mozo-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    try:
        return await _audit(
            client,
            store=store,
            run_id=run_id,
            epsilon=epsilon,
            delta=delta,
            alpha=alpha,
            trials=trials,
            n_exemplars=n_exemplars,
            n_shots=n_exemplars if n_shots is None else n_shots,
            top_k=top_k,
            max_tokens=max_tokens,
            per_context=queries_per_context,
            confidence=confidence,
            seed=seed,
            signals=signals,
            cleanup=cleanup,
            concurrency=concurrency,
            batch=batch,
        )
    finally:
        if own_client:
            await client.aclose()
        if own_store and store is not None:
            store.dispose()


async def _audit(
    client: DpiclClient,
    *,
    store: TrialStore | None,
    run_id: str,
    epsilon: float,
    delta: float | None,
    alpha: int | None,
    trials: int,
    n_exemplars: int,
    n_shots: int,
    top_k: int,
    max_tokens: int,
    per_context: int,
    confidence: float,
    seed: int,
    signals: tuple[str, str],
    cleanup: bool,
    concurrency: int,
    batch: int,
) -> JSON:
    t_start = time.perf_counter()
    design = mozo_design(n_exemplars, seed=seed, signals=signals)
    health = await client.health()
    mechanism: JSON = {
        "name": "dps-mozo",
        "epsilon": float(epsilon),
        "n_shots": int(n_shots),
        "top_k": int(top_k),
        "max_tokens": int(max_tokens),
        "queries": int(per_context),
    }
    if delta is not None:
        mechanism["delta"] = float(delta)
    if alpha is not None:
        mechanism["alpha"] = int(alpha)
    plan: JSON = {
        "kind": "mozo-black-box",
        "epsilon": epsilon,
        "delta": delta,
        "alpha": alpha,
        "trials": trials,
        "n_exemplars": n_exemplars,
        "n_shots": n_shots,
        "top_k": top_k,
        "max_tokens": max_tokens,
        "queries_per_context": per_context,
        "confidence": confidence,
        "seed": seed,
        "signals": list(signals),
        "target": client.base_url,
    }
    versions = {"auditor": __version__, "server": health, "python": platform.python_version()}
    setting = f"mozo:eps={epsilon:g}"
    if store is not None:
        store.create_run(run_id, plan=plan, versions=versions, design=design.to_dict())

    worlds = world_schedule(trials, seed)
    # Trial i -> (world, context slot within that world).
    slots: list[int] = []
    seen = [0, 0]
    for w in worlds:
        slots.append(seen[w] // per_context)
        seen[w] += 1
    n_ctx = [math.ceil(seen[w] / per_context) for w in (0, 1)]

    def body(world: int, k: int) -> JSON:
        ex = design.exemplars_c1 if world == 1 else design.exemplars_c0
        return {
            "name": f"{run_id} C{world} #{k}",
            "task": "generation",
            "exemplars": list(ex),
            "template": design.template,
            "mechanism": mechanism,
        }

    sem = asyncio.Semaphore(concurrency)

    async def create(world: int, k: int) -> JSON:
        async with sem:
            return await client.create_context(body(world, k))

    infos: dict[int, list[JSON]] = {0: [], 1: []}
    created: list[str] = []
    try:
        for w in (0, 1):
            got_ctx = await asyncio.gather(
                *(create(w, k) for k in range(n_ctx[w])), return_exceptions=True
            )
            ok = [g for g in got_ctx if isinstance(g, dict)]
            created.extend(str(i["id"]) for i in ok)  # so cleanup finds them on failure
            failed = [g for g in got_ctx if isinstance(g, BaseException)]
            if failed:
                raise failed[0]
            infos[w] = ok
        info1 = infos[1][0] if infos[1] else infos[0][0]
        mech_info: JSON = dict(info1.get("mechanism", {}))
        eps_theory = float(mech_info.get("epsilon", epsilon))
        delta_ctx = float(mech_info.get("delta") or (delta if delta is not None else 0.0))
        if not 0.0 < delta_ctx < 1.0:
            raise InvalidAuditInput(f"the context reports delta={delta_ctx!r}")

        async def one(i: int) -> TrialRecord:
            w = worlds[i]
            cid = str(infos[w][slots[i]]["id"])
            t0 = time.perf_counter()
            async with sem:
                out = await client.generate(cid, design.query)
            latency = time.perf_counter() - t0
            text = str(out["text"])
            cost = out.get("cost") if isinstance(out.get("cost"), dict) else {}
            obs = {
                "text": text,
                "starts_with": (
                    "signal1"
                    if decide(text, signals[0])
                    else "signal0"
                    if decide(text, signals[1])
                    else "other"
                ),
                "cost_epsilon": (cost or {}).get("epsilon"),
            }
            return TrialRecord(
                setting=setting,
                trial_index=i,
                world=w,
                context_id=cid,
                query=design.query,
                observation=obs,
                decision=decide(text, signals[0]),
                latency_s=latency,
                epsilon=eps_theory,
            )

        records: list[TrialRecord] = []
        for start in range(0, trials, batch):
            t_batch = time.perf_counter()
            got = list(
                await asyncio.gather(*(one(i) for i in range(start, min(start + batch, trials))))
            )
            records.extend(got)
            if store is not None:
                store.add_trials(
                    run_id,
                    got,
                    wall_time_s=time.perf_counter() - t_batch,
                    llm_calls_per_trial=n_exemplars + 1,
                )
    except (TargetError, InvalidAuditInput) as exc:
        if store is not None:
            store.update_run(run_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        if cleanup:
            await _delete_all(client, created, sem)

    result = _estimate(
        records,
        signals=signals,
        confidence=confidence,
        delta=delta_ctx,
        eps_theory=eps_theory,
        mech_info=mech_info,
        health=health,
    )
    result |= {
        "run_id": run_id,
        "design": design.to_dict(),
        "contexts": {"C1": len(infos[1]), "C0": len(infos[0]), "deleted": cleanup},
        "log": (
            {"kind": "sql", "url": store.engine.url.render_as_string(hide_password=True)}
            if store is not None
            else {"kind": "none"}
        ),
        "wall_time_s": time.perf_counter() - t_start,
    }
    if store is not None:
        store.update_run(
            run_id,
            status="completed",
            results=json.loads(json.dumps(result, default=float)),
            design=design.to_dict() | {"context_ids": created},
        )
    return result


async def _delete_all(client: DpiclClient, ids: Sequence[str], sem: asyncio.Semaphore) -> None:
    async def delete(cid: str) -> None:
        async with sem:
            # best effort: an exhausted context left behind costs nothing
            with contextlib.suppress(TargetError):
                await client.delete_context(cid)

    await asyncio.gather(*(delete(c) for c in ids))


def _estimate(
    records: Sequence[TrialRecord],
    *,
    signals: tuple[str, str],
    confidence: float,
    delta: float,
    eps_theory: float,
    mech_info: JSON,
    health: JSON,
) -> JSON:
    tp = sum(1 for r in records if r.world == 1 and r.decision == 1)
    fn = sum(1 for r in records if r.world == 1 and r.decision == 0)
    fp = sum(1 for r in records if r.world == 0 and r.decision == 1)
    tn = sum(1 for r in records if r.world == 0 and r.decision == 0)
    if tp + fn == 0 or fp + tn == 0:
        raise InvalidAuditInput("the schedule gave one world no trial; use more trials")
    est = estimate_from_counts(tp, fn, fp, tn, delta=delta, confidence=confidence)
    per = per_interval_confidence(confidence, 2)
    eps_emp = max(est.epsilon_lower, est.epsilon_lower_classic, 0.0)
    starts: dict[str, dict[str, int]] = {"C1": {}, "C0": {}}
    for r in records:
        key = "C1" if r.world == 1 else "C0"
        s = str(r.observation.get("starts_with"))
        starts[key][s] = starts[key].get(s, 0) + 1
    texts: dict[str, dict[str, int]] = {"C1": {}, "C0": {}}
    for r in records:
        key = "C1" if r.world == 1 else "C0"
        t = str(r.observation.get("text", ""))[:40]
        texts[key][t] = texts[key].get(t, 0) + 1
    common = {k: sorted(v.items(), key=lambda kv: -kv[1])[:5] for k, v in texts.items()}
    per_answer = [r.observation.get("cost_epsilon") for r in records]
    per_answer_eps = next((float(v) for v in per_answer if isinstance(v, int | float)), None)
    simulator = bool(health.get("simulator"))
    alpha = mech_info.get("alpha")
    beta = mech_info.get("beta")
    black_box = est.to_dict() | {
        "fpr_upper": clopper_pearson_upper(fp, fp + tn, per),
        "fnr_upper": clopper_pearson_upper(fn, tp + fn, per),
        "tpr_lower": clopper_pearson_lower(tp, tp + fn, per),
        "per_interval_confidence": per,
        "epsilon_emp": eps_emp,
        "epsilon_theory": eps_theory,
        "epsilon_theory_per_answer": per_answer_eps,
        "verdict": _verdict(eps_emp, eps_theory),
    }
    notes = [
        "epsilon_theory is the context's configured epsilon, derived by the paper's RDP "
        "analysis (Theorems A.3/A.4 with eps(j) = 4 beta alpha); it is nominal, because the "
        "per-token bound of Theorem B.3 does not hold (docs/privacy.md).",
        "A black-box bound from a single first-token event cannot see the per-token loss "
        "that breaks the theorem: the divergence blows up on tokens the released "
        "distribution almost never samples, so staying within the nominal epsilon here is "
        "no evidence that the claim holds; see bench/mozo_divergence.py for the white-box "
        "per-token divergences.",
    ]
    if simulator:
        notes.insert(
            0,
            "ORACLE SIMULATOR: DPS-MOZO runs on the oracle's decoding sessions, whose logits "
            "are pseudo-random hashes of the prompt text, not on its membership rules; the "
            "released text almost never starts with a signal word, so this audit measures "
            "about nothing here (it checks the plumbing).",
        )
    return {
        "engine": health.get("engine"),
        "model": health.get("model"),
        "simulator": simulator,
        "mechanism": {k: mech_info.get(k) for k in sorted(mech_info)},
        "alpha": alpha,
        "beta": beta,
        "per_token_bound": None if alpha is None or beta is None else 4 * beta * alpha,
        "delta": delta,
        "confidence": confidence,
        "signals": list(signals),
        "starts_with": starts,
        "common_texts": common,
        "epsilon_theory": eps_theory,
        "epsilon_emp": eps_emp,
        "black_box": black_box,
        "verdict": black_box["verdict"],
        "notes": notes,
    }


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dpicl_audit.mozo_audit",
        description="Black-box DPS-MOZO audit of a dpicl server over HTTP.",
    )
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    ap.add_argument("--admin-token", required=True, help="admin token (contexts)")
    ap.add_argument("--api-key", default=None, help="user key for /v1/generate (default: admin)")
    ap.add_argument("--epsilon", type=float, default=8.0, help="configured epsilon of each context")
    ap.add_argument("--delta", type=float, default=1e-5, help="delta (0: the server's 1/|D|)")
    ap.add_argument("--alpha", type=int, default=None, help="Renyi order (default: server's)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--exemplars", type=int, default=4, help="|D|, canary included")
    ap.add_argument("--shots", type=int, default=None, help="n_shots (default |D|: q = 1)")
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=2, help="T_max of the audit contexts")
    ap.add_argument("--queries-per-context", type=int, default=1)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--signals", nargs=2, default=list(SIGNALS), metavar=("S1", "S0"))
    ap.add_argument("--db", default=None, help="trial log (SQLAlchemy URL or SQLite path)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--keep-contexts", action="store_true", help="do not delete contexts")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    return ap


async def _amain(args: argparse.Namespace) -> JSON:
    client = DpiclClient(
        args.url,
        admin_token=args.admin_token,
        api_key=args.api_key,
        concurrency=args.concurrency,
        timeout=args.timeout,
    )
    async with client:
        return await audit_mozo(
            client,
            epsilon=args.epsilon,
            delta=args.delta or None,
            alpha=args.alpha,
            trials=args.trials,
            n_exemplars=args.exemplars,
            n_shots=args.shots,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            queries_per_context=args.queries_per_context,
            confidence=args.confidence,
            seed=args.seed,
            signals=(args.signals[0], args.signals[1]),
            db=args.db,
            cleanup=not args.keep_contexts,
            concurrency=args.concurrency,
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        res = asyncio.run(_amain(args))
    except (TargetError, InvalidAuditInput) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res, indent=2, default=float))
        return 0
    bb = res["black_box"]
    print(f"engine {res['engine']} ({res['model']}), simulator={res['simulator']}")
    print(
        f"alpha={res['alpha']} beta={res['beta']} per-token bound 4*beta*alpha="
        f"{res['per_token_bound']} delta={res['delta']:g}"
    )
    print(f"first-token outcomes: {res['starts_with']}")
    print(f"most common texts: {res['common_texts']}")
    print(
        f"tp={bb['tp']} fn={bb['fn']} fp={bb['fp']} tn={bb['tn']}  FPR<={bb['fpr_upper']:.3f} "
        f"FNR<={bb['fnr_upper']:.3f} ({res['confidence']:.0%} joint)"
    )
    print(
        f"mu_lower={bb['mu_lower']:.3f} eps_GDP={bb['epsilon_lower']:.3f} "
        f"eps_classic={bb['epsilon_lower_classic']:.3f} -> epsilon_emp={res['epsilon_emp']:.3f} "
        f"vs epsilon_theory={res['epsilon_theory']:g} (nominal)"
    )
    print(res["verdict"]["message"])
    for note in res["notes"]:
        print(f"note: {note}")
    print(f"trial log: {res['log']}; run {res['run_id']}; {res['wall_time_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
