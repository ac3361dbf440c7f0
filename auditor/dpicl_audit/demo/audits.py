"""The demo's audits (:mod:`.main` runs them): the oracle's bootstrap and real-trial runs, ESA
on the oracle, and the real model's runs planned by power to fit the time budget
(:mod:`dpicl_audit.estimators.trial_budget`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpicl_audit.demo.servers import DemoServer
from dpicl_audit.demo.talk import (
    console,
    heartbeat,
    need_text,
    say,
    stopped_message,
    trials_message,
)
from dpicl_audit.estimators.trial_budget import POWER_MARGIN, plan_trials, planned_needs
from dpicl_audit.jsontypes import JsonMapping, JsonObject, json_float, json_object
from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import CLEAN_SETTING, new_run_id
from dpicl_audit.results import RunResult
from dpicl_audit.store import TrialRecord, TrialStore

__all__ = ["MODEL_PROBES", "Counts", "audit_esa", "audit_model", "audit_oracle", "say"]

EPSILONS = (1.0, 2.0, 4.0, 8.0)
#: The status of a run the demo stopped at its share of the time (the report says so).
TIME_LIMITED = "time-limited"
N_SAMPLE = 400_000


# ====================================================================== audits


def _plan(srv: DemoServer, **overrides: Any) -> AuditPlan:
    base: JsonObject = {
        "target.base_url": srv.url,
        "target.admin_token": srv.admin_token,
        "target.api_key": srv.api_key,
        "mechanism.epsilons": list(EPSILONS),
        "seed": 2024,
    }
    return AuditPlan.from_sources(None, base | overrides)


def _summarise(results: JsonMapping) -> None:
    for s in RunResult.from_json(results).settings:
        parts = []
        for key in ("black_box", "white_box"):
            est = s.estimate(key)
            if est is None or est.epsilon_lower is None:
                continue
            parts.append(
                f"{key.replace('_', '-')} ε_emp={est.epsilon_lower:.3f} "
                f"({'?' if est.verdict is None else est.verdict.status})"
            )
        exact_s = f"{s.epsilon_exact:.3f}" if s.epsilon_exact is not None else "-"
        console.print(
            f"    {s.setting!s:>6}  ε_theory={float(s.epsilon_theory or 0.0):g}  "
            f"ε_exact={exact_s}  " + "  ".join(parts)
        )


@dataclass
class Counts:
    # The oracle's clean votes are deterministic: a few vectors per world say all there is.
    oracle_n_llm: int = 4
    oracle_trials: int = 200
    # The real model at temperature 0 with the identical-text design: its clean votes are
    # deterministic too (measured: 24 of 24 identical per world), so a few vectors suffice.
    model_n_llm: int = 6
    # Real trials on the model always run (at least this many per epsilon): they show the
    # real pipeline end to end, and their verdict says what so few trials cannot prove.
    # The rest of the time goes where power needs it (dpicl_audit.estimators.trial_budget).
    model_trials_min: int = 20
    model_trials_max: int = 600
    n_sample: int = N_SAMPLE
    esa_oracle_n_llm: int = 4


#: Real-model epsilons: where the strong design's audit is informative (issue 14, item 5);
#: epsilon 1 and 2 would only add minutes of CPU for bounds the oracle rows already show.
MODEL_EPSILONS = (4.0, 8.0)


def _esa_overrides(n_llm: int, n_sample: int, *, model: bool) -> JsonObject:
    """ESA bootstrap on the bundled dialogue set with Table 3's first signal pair."""
    out: JsonObject = {
        "mechanism.name": "esa",
        "mechanism.partitions": 4,
        "mechanism.shots": 2,
        "bootstrap.n_llm": n_llm,
        "bootstrap.n_sample": n_sample,
    }
    if model:
        # Each ESA query is T partition generations plus T_cand candidates on the CPU:
        # short answers and few candidates keep the demo inside its time budget.
        out |= {"mechanism.candidates": 2, "mechanism.max_tokens": 24}
    return out


async def audit_esa(
    srv: DemoServer, db: Path, out: Path, n_llm: int, n_sample: int, t0: float, *, model: bool
) -> tuple[str, str]:
    label = "transformers" if model else "oracle"
    say(t0, f"{label}: ESA bootstrap, n_llm={n_llm}, n_sample={n_sample:,}")
    with heartbeat(t0, f"{label}: ESA bootstrap"):
        res = await bootstrap_audit(
            _plan(
                srv,
                name=f"demo {label} ESA bootstrap",
                concurrency=2 if model else 8,
                timeout=600.0,
                **_esa_overrides(n_llm, n_sample, model=model),
            ),
            db=db,
            out_dir=out,
            console=console,
        )
    _summarise(res)
    rows = []
    for s_ in RunResult.from_json(res).settings:
        wb = s_.white_box
        rows.append(
            f"eps={float(s_.epsilon_theory or 0.0):g}: "
            f"exact(2/T)={float(s_.epsilon_exact or 0.0):.3f}, "
            f"exact(actual shift)={float(s_.get('epsilon_exact_signal') or 0):.3f}, "
            f"white-box emp={float((wb and wb.epsilon_lower) or 0):.3f}"
        )
    note = (
        f"ESA on the {label} engine (T=4, bootstrap n_llm={n_llm} clean partition-mean vectors "
        f"per world, n_sample={n_sample:,}; signal pair clock/foxborough of Table 3, Prompt 2): "
        + "; ".join(rows)
        + "."
    )
    console.print(f"    {note}")
    return str(res["run_id"]), note


async def audit_oracle(
    srv: DemoServer, db: Path, out: Path, counts: Counts, t0: float, notes: list[str]
) -> list[str]:
    ids = []
    say(t0, f"oracle: bootstrap, n_llm={counts.oracle_n_llm}, n_sample={counts.n_sample:,}")
    with heartbeat(t0, "oracle: bootstrap"):
        res = await bootstrap_audit(
            _plan(
                srv,
                name="demo oracle bootstrap",
                **{"bootstrap.n_llm": counts.oracle_n_llm, "bootstrap.n_sample": counts.n_sample},
            ),
            db=db,
            out_dir=out,
            console=console,
        )
    _summarise(res)
    ids.append(str(res["run_id"]))
    for threat in ("white-box", "black-box"):
        say(t0, f"oracle: {counts.oracle_trials} real {threat} trials per epsilon")
        with heartbeat(t0, f"oracle: {threat} run"):
            res = await run_audit(
                _plan(
                    srv,
                    name=f"demo oracle {threat}",
                    threat_model=threat,
                    trials=counts.oracle_trials,
                    concurrency=8,
                ),
                db=db,
                out_dir=out,
                console=console,
            )
        _summarise(res)
        ids.append(str(res["run_id"]))
    notes.append(
        f"Oracle simulator: bootstrap with n_llm={counts.oracle_n_llm} clean vote vectors per "
        f"world and n_sample={counts.n_sample:,} simulated trials per world; "
        f"{counts.oracle_trials} real white-box trials per epsilon through /v1/debug/classify "
        f"(their released labels give the black-box estimate of that run) and "
        f"{counts.oracle_trials} real black-box trials per epsilon through /v1/classify."
    )
    return ids


#: The audits from outside the real model's runs make: the ledger's and the calibration's
#: (a few answers each). The client-parameter sweep asks every parameter on every route and
#: took 181 s on the CPU model in issue 45's new-user pass, most of the demo's time: it is
#: left out there (the oracle's runs make it), and the demo says so before the runs.
MODEL_PROBES = ("ledger", "calibration")

_PROBES_LINE = (
    f"model: the audits from outside are {', '.join(MODEL_PROBES)} (the client-parameter "
    "sweep takes minutes on the CPU model: the oracle's runs make it)"
)

#: The real model's audits ask two queries at a time (the server batches them; 2 cores).
_MODEL_CONCURRENCY = 2
#: Seconds kept from the budget for stopping the servers and writing the report (measured:
#: about 10 s on 2 cores).
_REPORT_RESERVE_S = 25.0
#: Seconds a real run spends besides its trials, until one measures it (measured: 2-8 s).
_RUN_OVERHEAD_S = 10.0
#: How far past its planned time a real run may go before the demo stops it (x the plan).
_OVERRUN = 1.3


async def audit_model(
    srv: DemoServer,
    db: Path,
    out: Path,
    counts: Counts,
    t0: float,
    deadline: float,
    notes: list[str],
) -> list[str]:
    ids = []
    say(t0, _PROBES_LINE)
    say(t0, f"model: bootstrap, n_llm={counts.model_n_llm}, n_sample={counts.n_sample:,}")
    t_boot = time.monotonic()
    with heartbeat(t0, "model: bootstrap"):
        res = await bootstrap_audit(
            _plan(
                srv,
                name="demo transformers bootstrap",
                concurrency=_MODEL_CONCURRENCY,
                timeout=600.0,
                probes=list(MODEL_PROBES),
                **{
                    "bootstrap.n_llm": counts.model_n_llm,
                    "bootstrap.n_sample": counts.n_sample,
                    "mechanism.epsilons": list(MODEL_EPSILONS),
                },
            ),
            db=db,
            out_dir=out,
            console=console,
        )
    boot_s = time.monotonic() - t_boot
    _summarise(res)
    ids.append(str(res["run_id"]))
    clean = _logged_rows(db, str(res["run_id"]), CLEAN_SETTING)
    votes_note = _clean_votes_note(clean)
    console.print(f"    {votes_note}")
    boot = RunResult.from_json(res)
    queries = max(1, boot.queries or 2 * counts.model_n_llm)
    # Wall seconds a real trial takes, until the first real run measures it: the
    # bootstrap's median logged query latency over the concurrency both runs use. Its
    # queries include each context's first (cache misses), so this errs long.
    per_trial = _wall_per_trial(clean, boot_s / queries / _MODEL_CONCURRENCY)
    needs = planned_needs(res)
    design = boot.design.get("design", "?")
    note = (
        f"Real model (transformers, CPU), {design} design (docs/auditing.md, 'Designs'): "
        f"bootstrap at epsilon {', '.join(f'{e:g}' for e in MODEL_EPSILONS)} with "
        f"n_llm={counts.model_n_llm} clean vote vectors per world ({queries} queries in "
        f"{boot_s:.0f} s, 4 partitions = 4 LLM calls per query) and "
        f"n_sample={counts.n_sample:,}. {votes_note}"
    )
    # Real white-box trials, one run per epsilon, planned by power
    # (dpicl_audit.estimators.trial_budget)
    # and planned again before each run at the rates the run before it measured: seconds a
    # trial (its logged latencies) and seconds a run spends besides (contexts, first
    # queries). The smallest allocations run first, so the large ones are planned at
    # measured rates.
    overhead = _RUN_OVERHEAD_S
    ran: list[str] = []
    rest = list(needs)
    while rest:
        left = deadline - time.monotonic() - _REPORT_RESERVE_S - overhead * len(rest)
        fit = math.floor(max(0.0, left) / per_trial)
        alloc = plan_trials(
            {e: needs[e] for e in rest},
            fit,
            minimum=counts.model_trials_min,
            maximum=counts.model_trials_max,
        )
        eps = min(rest, key=lambda e: (alloc[e], e))
        rest.remove(eps)
        trials = alloc[eps]
        say(t0, trials_message(eps, trials, needs[eps], fit, per_trial, counts.model_trials_min))
        t_run = time.monotonic()
        # Re-planned as it goes: a run that overruns its share of the time (the machine got
        # slower than the rate it was planned at) is stopped there, and its logged trials
        # are what the report estimates from. Stopping at a time, whatever the answers were,
        # does not bias the estimate; a run cut short is INCONCLUSIVE where it lacks power.
        share = (trials * per_trial + overhead) * _OVERRUN + _RUN_OVERHEAD_S
        cap = max(_RUN_OVERHEAD_S, min(share, deadline - t_run - _REPORT_RESERVE_S))
        with heartbeat(t0, f"model: epsilon {eps:g} white-box run"):
            run_id, run_res = await _white_box_run(srv, db, out, eps, trials, cap)
        wall = time.monotonic() - t_run
        logged = _logged_rows(db, run_id)
        done = len(logged)
        per_trial = _wall_per_trial(logged, wall / max(1, done))
        overhead = max(0.0, wall - done * per_trial)
        if run_res is None:
            say(t0, stopped_message(eps, cap, done, trials, per_trial))
        else:
            _summarise(run_res)
        ids.append(run_id)
        ran.append(
            f"{done if run_res is None else trials} at epsilon {eps:g}"
            + (f" (stopped at its time share, of {trials} planned)" if run_res is None else "")
            + f" (power needs about {need_text(needs[eps])})"
        )
    note += (
        f" Real white-box trials (the black-box estimate comes from the same answers' released "
        f"labels): {'; '.join(ran)}. The need is the bootstrap's real_trials_for_power: the "
        "verdicts' own power model of the real run's two figures, with the bootstrap's design, "
        f"times {POWER_MARGIN:g} (dpicl_audit.estimators.trial_budget). Every "
        f"epsilon gets at least {counts.model_trials_min} trials, and the rest of the time goes "
        "to the epsilons whose need fits it. A setting with fewer trials than it needs is "
        "INCONCLUSIVE, and its verdict says how many would do."
    )
    notes.append(note)
    return ids


async def _white_box_run(
    srv: DemoServer, db: Path, out: Path, eps: float, trials: int, cap: float
) -> tuple[str, JsonObject | None]:
    """One real white-box run at ``eps``, stopped after ``cap`` seconds: its id, and its
    results (None where it was stopped)."""
    run_id = new_run_id()
    plan = _plan(
        srv,
        name=f"demo transformers white-box eps={eps:g}",
        threat_model="white-box",
        trials=trials,
        concurrency=_MODEL_CONCURRENCY,
        timeout=600.0,
        probes=list(MODEL_PROBES),
        **{"mechanism.epsilons": [eps]},
    )
    try:
        run = run_audit(plan, db=db, run_id=run_id, out_dir=out, console=console)
        return run_id, await asyncio.wait_for(run, timeout=cap)
    except TimeoutError:
        # Stopped on purpose, at its share of the time: not "interrupted" (the runner's word
        # for Ctrl-C), which the report would show (issue 45).
        store = TrialStore(db)
        try:
            store.update_run(
                run_id,
                status=TIME_LIMITED,
                error=f"stopped by the demo at {cap:.0f} s, its share of the time budget",
            )
        finally:
            store.dispose()
        return run_id, None


def _logged_rows(db: Path, run_id: str, setting: str | None = None) -> list[TrialRecord]:
    """A run's logged trials (of one setting: a bootstrap's clean-vote queries)."""
    store = TrialStore(db)
    try:
        return store.trials(run_id, setting)
    finally:
        store.dispose()


def _wall_per_trial(rows: Sequence[TrialRecord], default: float) -> float:
    """Wall seconds a trial takes at the demo's concurrency: the median logged latency of
    ``rows`` over the queries in flight (``default``: no rows)."""
    latencies = sorted(r.latency_s for r in rows)
    return latencies[len(latencies) // 2] / _MODEL_CONCURRENCY if latencies else default


def _clean_votes_note(rows: Sequence[TrialRecord]) -> str:
    """What the collected clean votes look like in each world (the leakage there is)."""
    seen: dict[int, Counter[str]] = {0: Counter(), 1: Counter()}
    for r in rows:
        votes = json_object(r.observation.get("clean_votes"))
        key = ", ".join(f"{k}={json_float(v):g}" for k, v in sorted(votes.items()))
        seen[r.world][key] += 1
    desc = "; ".join(
        f"C{w}: " + ", ".join(f"[{k}] x{n}" for k, n in seen[w].most_common(3)) for w in (1, 0)
    )
    if seen[0] and seen[0] == seen[1] and len(seen[1]) == 1:
        return (
            f"Clean votes ({desc}) are identical with and without the canary: the model's "
            "answers do not depend on it, so no attack can detect it and epsilon_emp = 0 is "
            "the truth for this canary, far below the guarantee (the noise only adds privacy)."
        )
    return f"Clean votes collected: {desc}."
