"""Running audits: real-query runs, bootstrap runs (Algorithm 1 of paper 000), resume.

The run's life, one module per step::

    plan (plan.py) -> design (mechanisms/<name>/) -> contexts (contexts.py)
      -> trials (trials.py, schedule.py) -> SQL trial log (store.py)
      -> estimates (estimation.py, estimators/, bootstrap.py) -> verdicts (verdicts.py)
      -> results (results.py) and reports (report/)

A **run** (``kind="run"``) audits with real queries: for every epsilon of the plan it gets
the neighbour contexts C1 and C0 (:class:`~dpicl_audit.pipeline.contexts.ContextBook`) and sends
``plan.trials`` audit queries, each to the world the seeded schedule says
(:func:`~dpicl_audit.planning.schedule.trial_worlds`). A **bootstrap** run (``kind="bootstrap"``)
collects ``bootstrap.n_llm`` clean rows per world from the debug endpoint at ``internal``
(logged as the setting ``clean``) and simulates ``bootstrap.n_sample`` noisy trials per world
and epsilon. What a trial sends and observes, and how it is estimated, is the mechanism
module's business (:mod:`dpicl_audit.mechanisms`); this module only drives the steps.

**Resume.** Contexts are recorded in the run and named after it on the server; trials are
written in batches with idempotent inserts. :func:`resume_audit` runs only the trial indices
missing from the log, so a run killed at any point (SIGKILL included) finishes with every
index exactly once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from dpicl_audit.client import AuditTarget, DpiclClient
from dpicl_audit.datasets import load_dataset
from dpicl_audit.errors import (
    AuditError,
    InvalidAuditInput,
    InvalidPlan,
)
from dpicl_audit.mechanisms.base import Design
from dpicl_audit.mechanisms.neighbours import resolve_design
from dpicl_audit.mechanisms.registry import get_mechanism
from dpicl_audit.pipeline.contexts import ContextBook
from dpicl_audit.pipeline.estimation import estimate_run, run_design
from dpicl_audit.pipeline.legacy import is_legacy_mozo
from dpicl_audit.pipeline.progress import ProgressSink, open_progress
from dpicl_audit.pipeline.results import finish_run, out_directory, write_results
from dpicl_audit.pipeline.session import (
    client_for,
    need_context_maker,
    opened_store,
    run_versions,
    server_health,
)
from dpicl_audit.pipeline.trials import TrialExecutor
from dpicl_audit.plan import AuditPlan
from dpicl_audit.planning.schedule import (
    CLEAN_SETTING,
    check_run_id,
    clean_worlds,
    context_slots,
    new_run_id,
    trial_worlds,
)
from dpicl_audit.store import ContextRecord, TrialStore

__all__ = [
    "CLEAN_SETTING",
    "AuditRunner",
    "bootstrap_audit",
    "estimate_run",
    "new_run_id",
    "resume_audit",
    "run_audit",
    "trial_worlds",
]

RunKind = Literal["run", "bootstrap"]


class AuditRunner:
    """Executes one run of the trial log against one target.

    Use :func:`run_audit`, :func:`bootstrap_audit` and :func:`resume_audit` rather than this
    class directly; it is public for tests, benchmarks and embedding.
    """

    def __init__(
        self,
        store: TrialStore,
        target: AuditTarget,
        *,
        run_id: str,
        plan: AuditPlan,
        design: Design,
        kind: RunKind,
        progress: bool = True,
        console: Console | None = None,
    ) -> None:
        self.store = store
        self.target = target
        self.run_id = run_id
        self.plan = plan
        self.design = design
        self.kind = kind
        self.console = console or Console(stderr=True)
        self.show_progress = progress
        self.mechanism = get_mechanism(plan.mechanism.name)
        self.contexts = ContextBook(
            store,
            target,
            run_id=run_id,
            plan=plan,
            mechanism=self.mechanism,
            design=design,
            console=self.console,
        )
        self.trials = TrialExecutor(
            store, target, run_id=run_id, plan=plan, mechanism=self.mechanism
        )

    async def execute(self) -> dict[str, Any]:
        """Run (or continue) every missing part of this run, then estimate and save."""
        self.store.update_run(self.run_id, status="running", error=None)
        self.trials.restart_clock()
        try:
            with open_progress(self.console, self.show_progress) as progress:
                if self.kind == "run":
                    await self._execute_trials(progress)
                else:
                    await self._execute_bootstrap_collection(progress)
            await self.trials.flush()
            t0 = time.monotonic()
            results = await asyncio.to_thread(estimate_run, self.store, self.run_id)
            # The ledger audited from outside (pipeline.ledger), where the mechanism can.
            ledger = await self.mechanism.audit_ledger(self.target, self.design, self.plan)
            if ledger is not None:
                results["ledger"] = ledger
            self.store.add_usage(self.run_id, wall_time_s=time.monotonic() - t0)
            results = finish_run(self.store, self.run_id, results)
        except AuditError as exc:
            await self.trials.flush()
            self.store.update_run(self.run_id, status="failed", error=str(exc))
            raise
        except (asyncio.CancelledError, KeyboardInterrupt):
            await asyncio.shield(self.trials.flush())
            self.store.update_run(self.run_id, status="interrupted")
            raise
        if self.mechanism.queries_per_context(self.plan) is not None:
            await self.contexts.delete_all()  # spent contexts: nothing left to answer
        return results

    async def _prepare(self, contexts: Mapping[int, ContextRecord]) -> None:
        """Let the mechanism learn what it needs before the trials (recorded in the run)."""
        design = await self.mechanism.prepare(
            self.target, self.design, self.plan, contexts, bootstrap=self.kind == "bootstrap"
        )
        if design is not self.design:
            self.design = design
            self.contexts.design = design
            self.store.update_run(self.run_id, design=design.to_json())
        self.trials.design = self.design

    async def _execute_trials(self, progress: ProgressSink) -> None:
        white = self.plan.threat_model == "white-box"
        per_context = self.mechanism.queries_per_context(self.plan)
        self.trials.design = self.design
        for k, eps in enumerate(self.plan.mechanism.epsilons):
            setting = self.plan.setting_key(eps)
            worlds = trial_worlds(self.plan.seed, k, self.plan.trials)
            if per_context is None:
                await self._prepare(await self.contexts.pair(setting, eps))
            slots = context_slots(worlds, per_context)

            async def pick(
                index: int,
                world: int,
                spent: ContextRecord | None,
                setting: str = setting,
                eps: float = eps,
                slots: list[int] = slots,
            ) -> ContextRecord:
                if spent is not None:
                    return await self.contexts.replace(setting, eps, world, slots[index], spent)
                return await self.contexts.get(setting, eps, world, slots[index])

            await self.trials.run(
                setting,
                eps,
                worlds,
                pick,
                white=white,
                progress=progress,
                description=f"{setting} {self.plan.threat_model}",
            )

    async def _execute_bootstrap_collection(self, progress: ProgressSink) -> None:
        per_eps: list[dict[int, ContextRecord]] = []
        for eps in self.plan.mechanism.epsilons:
            per_eps.append(await self.contexts.pair(self.plan.setting_key(eps), eps))
        await self._prepare(per_eps[0])

        async def pick(index: int, world: int, spent: ContextRecord | None) -> ContextRecord:
            # Clean votes do not depend on epsilon, so pair j (indices 2j, 2j+1) goes to the
            # contexts of epsilon j mod K: the same clean rows serve every epsilon, and every
            # epsilon's noisy votes feed its own noise check (dpicl_audit.estimators.noise_check).
            return per_eps[(index // 2) % len(per_eps)][world]

        await self.trials.run(
            CLEAN_SETTING,
            None,
            clean_worlds(self.plan.bootstrap.n_llm),
            pick,
            white=True,
            need_clean=True,
            progress=progress,
            description=self.mechanism.clean_name,
        )


# ====================================================================== entry points


async def _start(
    plan: AuditPlan,
    kind: RunKind,
    *,
    db: str | Path | None,
    schema: str | None,
    store: TrialStore | None,
    run_id: str | None,
    target: AuditTarget | None,
    out_dir: str | Path,
    progress: bool,
    console: Console | None,
) -> dict[str, Any]:
    if run_id is not None:
        check_run_id(run_id)
    out_directory(out_dir)
    need_context_maker(plan, "the audit")
    mechanism = get_mechanism(plan.mechanism.name)
    if kind == "bootstrap" and not mechanism.has_bootstrap:
        raise InvalidPlan(f"{mechanism.name} has no bootstrap audit; use `dpicl-audit run`")
    own_client = target is None
    client: AuditTarget = target if target is not None else client_for(plan)
    try:
        health, herr = await server_health(client)
        # ``design = "auto"``: the strongest design for the engine (a real model copies an
        # identical demonstration; the simulator follows Prompt 1); stored resolved.
        simulator = bool(health.get("simulator")) if health is not None else False
        plan = plan.model_copy(update={"design": resolve_design(plan, simulator=simulator)})
        design = mechanism.build_design(plan, load_dataset(plan.dataset))
        with opened_store(store, db, schema) as st:
            rid = run_id or new_run_id()
            st.create_run(
                rid,
                plan=plan.public_dump(),
                versions=run_versions(health, herr),
                kind=kind,
                name=plan.name,
                design=design.to_json(),
            )
            runner = AuditRunner(
                st,
                client,
                run_id=rid,
                plan=plan,
                design=design,
                kind=kind,
                progress=progress,
                console=console,
            )
            results = await runner.execute()
    finally:
        if own_client and isinstance(client, DpiclClient):
            await client.aclose()
    write_results(results, out_dir)
    return results


async def run_audit(
    plan: AuditPlan,
    *,
    db: str | Path | None = None,
    schema: str | None = None,
    store: TrialStore | None = None,
    run_id: str | None = None,
    target: AuditTarget | None = None,
    out_dir: str | Path = "runs",
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Audit with real queries (see the module docstring); returns the results dict."""
    return await _start(
        plan,
        "run",
        db=db,
        schema=schema,
        store=store,
        run_id=run_id,
        target=target,
        out_dir=out_dir,
        progress=progress,
        console=console,
    )


async def bootstrap_audit(
    plan: AuditPlan,
    *,
    db: str | Path | None = None,
    schema: str | None = None,
    store: TrialStore | None = None,
    run_id: str | None = None,
    target: AuditTarget | None = None,
    out_dir: str | Path = "runs",
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Audit with Algorithm 1 of paper 000 (clean votes + simulated noise)."""
    return await _start(
        plan,
        "bootstrap",
        db=db,
        schema=schema,
        store=store,
        run_id=run_id,
        target=target,
        out_dir=out_dir,
        progress=progress,
        console=console,
    )


async def resume_audit(
    run_id: str,
    *,
    db: str | Path | None = None,
    schema: str | None = None,
    store: TrialStore | None = None,
    admin_token: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    target: AuditTarget | None = None,
    out_dir: str | Path = "runs",
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Continue a run from its log: only missing trial indices are run.

    Tokens are never stored, so they come again from the arguments (CLI flags or the
    environment); ``base_url`` may point the run at the server's new address.
    """
    out_directory(out_dir)
    with opened_store(store, db, schema) as st:
        if is_legacy_mozo(st.get_run(run_id)):
            raise InvalidAuditInput(
                f"run {run_id} was logged by the old DPS-MOZO audit, which ran to the end or "
                "not at all; it has nothing to resume (show or report it)"
            )
        run = st.get_run(run_id)
        plan = AuditPlan.from_public(
            run.plan, admin_token=admin_token, api_key=api_key, base_url=base_url
        )
        if run.design is None:
            raise InvalidAuditInput(f"run {run_id} has no recorded design; it cannot resume")
        design = run_design(run, plan)
        if target is None:
            need_context_maker(plan, f"resuming {run_id}")
        own_client = target is None
        client: AuditTarget = target if target is not None else client_for(plan)
        try:
            health, herr = await server_health(client)
            versions = dict(run.versions)
            resumes = list(versions.get("resumed", []))
            resumes.append(
                {"at": dt.datetime.now(dt.UTC).isoformat(), "server": health or {"error": herr}}
            )
            versions["resumed"] = resumes
            st.update_run(run_id, versions=versions)
            kind: RunKind = "bootstrap" if run.kind == "bootstrap" else "run"
            runner = AuditRunner(
                st,
                client,
                run_id=run_id,
                plan=plan,
                design=design,
                kind=kind,
                progress=progress,
                console=console,
            )
            results = await runner.execute()
        finally:
            if own_client and isinstance(client, DpiclClient):
                await client.aclose()
    write_results(results, out_dir)
    return results
