"""The life of a run, one for ``run``, ``bootstrap`` and ``resume``.

The run's life, one module per step::

    plan (plan/) -> design (mechanisms/<name>/) -> contexts (pipeline/contexts.py)
      -> trials (pipeline/trials.py, plan/schedule.py) -> SQL trial log (store/)
      -> estimates (pipeline/estimation.py, estimators/) -> verdicts (verdicts/)
      -> results (pipeline/results.py) and reports (report/)

Every life is :func:`_life`: the target's client opened and its health read, the run begun
(before the trial log opens, so that a server that cannot be reached or a plan whose design
cannot be built leaves no log behind), the trial log opened and the run recorded there, its
one :class:`~dpicl_audit.pipeline.run_context.RunContext` executed
(:class:`~dpicl_audit.pipeline.runner.AuditRunner`), the client closed and the results
written. Only the beginning differs: a new run (:func:`run_audit`, :func:`bootstrap_audit`)
resolves and builds its design and creates the run; a resumed one (:func:`resume_audit`) has
read them back from the log and records the resume.

**Resume.** Contexts are recorded in the run and named after it on the server; trials are
written in batches with idempotent inserts. :func:`resume_audit` runs only the trial indices
missing from the log, so a run killed at any point (SIGKILL included) finishes with every
index exactly once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypedDict, Unpack

from rich.console import Console

from dpicl_audit.client import AuditTarget, DpiclClient
from dpicl_audit.datasets import load_dataset
from dpicl_audit.errors import InvalidAuditInput, InvalidPlan
from dpicl_audit.jsontypes import JsonMapping, JsonObject, JsonValue, json_object
from dpicl_audit.mechanisms.neighbours import resolve_design
from dpicl_audit.mechanisms.registry import get_mechanism, upgraded_run
from dpicl_audit.pipeline.estimation import run_design
from dpicl_audit.pipeline.results import out_directory, write_results
from dpicl_audit.pipeline.run_context import RunContext, RunKind
from dpicl_audit.pipeline.runner import AuditRunner
from dpicl_audit.pipeline.session import (
    client_for,
    need_context_maker,
    opened_store,
    refuse_unbudgeted,
    run_versions,
    server_health,
    with_budget_limit,
)
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.deployment import adopt_deployment, deployment_settings
from dpicl_audit.plan.schedule import check_run_id, new_run_id
from dpicl_audit.store import TrialStore

__all__ = ["bootstrap_audit", "resume_audit", "run_audit"]


class Where(TypedDict, total=False):
    """Where a run's life happens: the trial log (``db`` URL and ``schema``, or an open
    ``store``), the server (``target``, else the plan's own client), the results folder
    (``out_dir``, default ``runs``), and whether progress is shown (default yes) and on
    which ``console`` (default stderr)."""

    db: str | Path | None
    schema: str | None
    store: TrialStore | None
    target: AuditTarget | None
    out_dir: str | Path
    progress: bool
    console: Console | None


#: ``record(store)``: the run recorded in the trial log, as its context.
Record = Callable[[TrialStore], RunContext]
#: ``begin(client, health, health_error)``: the run made ready before the trial log opens.
Begin = Callable[[AuditTarget, JsonMapping | None, str | None], Awaitable[Record]]


@asynccontextmanager
async def _client(plan: AuditPlan, target: AuditTarget | None) -> AsyncIterator[AuditTarget]:
    """The given target, or the plan's own client (closed on the way out)."""
    client: AuditTarget = target if target is not None else client_for(plan)
    try:
        yield client
    finally:
        if target is None and isinstance(client, DpiclClient):
            await client.aclose()


async def _life(plan: AuditPlan, begin: Begin, where: Where) -> JsonObject:
    """The one life of a run (module docstring); returns its results dict."""
    async with _client(plan, where.get("target")) as client:
        health, herr = await server_health(client)
        record = await begin(client, health, herr)
        with opened_store(where.get("store"), where.get("db"), where.get("schema")) as st:
            run = record(st)
            results = await AuditRunner(run, progress=where.get("progress", True)).execute()
    write_results(results, where.get("out_dir", "runs"))
    return results


async def _start(plan: AuditPlan, kind: RunKind, run_id: str | None, where: Where) -> JsonObject:
    if run_id is not None:
        check_run_id(run_id)
    out_directory(where.get("out_dir", "runs"))
    need_context_maker(plan, "the audit")
    mechanism = get_mechanism(plan.mechanism.name)
    if kind == "bootstrap" and not mechanism.has_bootstrap:
        raise InvalidPlan(f"{mechanism.name} has no bootstrap audit; use `dpicl-audit run`")

    async def begin(client: AuditTarget, health: JsonMapping | None, herr: str | None) -> Record:
        # ``design = "auto"``: the strongest design for the engine (a real model copies an
        # identical demonstration; the simulator follows Prompt 1); stored resolved.
        simulator = bool(health.get("simulator")) if health is not None else False
        deployed = plan
        if plan.deployment.context is not None:  # its own epsilon, partitions and delta
            found = await deployment_settings(client, plan.deployment.context)
            deployed = adopt_deployment(plan, found)
        resolved = deployed.model_copy(
            update={
                "design": resolve_design(deployed, simulator=simulator),
                # The server's largest budget, stored resolved: a resume plans the same slots.
                "target": with_budget_limit(deployed.target, health),
            }
        )
        design = mechanism.build_design(resolved, load_dataset(resolved.dataset))
        refuse_unbudgeted(mechanism, design, resolved, health)

        def record(st: TrialStore) -> RunContext:
            rid = run_id or new_run_id()
            st.create_run(
                rid,
                plan=resolved.public_dump(),
                versions=run_versions(health, herr),
                kind=kind,
                name=resolved.name,
                design=design.to_json(),
            )
            console = where.get("console") or _console()
            return RunContext(st, client, rid, resolved, design, kind, console)

        return record

    return await _life(plan, begin, where)


def _console() -> Console:
    return Console(stderr=True)


async def run_audit(
    plan: AuditPlan, *, run_id: str | None = None, **where: Unpack[Where]
) -> JsonObject:
    """Audit with real queries (see :mod:`.runner`); returns the results dict."""
    return await _start(plan, "run", run_id, where)


async def bootstrap_audit(
    plan: AuditPlan, *, run_id: str | None = None, **where: Unpack[Where]
) -> JsonObject:
    """Audit with Algorithm 1 of paper 000 (clean votes + simulated noise)."""
    return await _start(plan, "bootstrap", run_id, where)


async def resume_audit(
    run_id: str,
    *,
    admin_token: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    **where: Unpack[Where],
) -> JsonObject:
    """Continue a run from its log: only missing trial indices are run.

    Tokens are never stored, so they come again from the arguments (CLI flags or the
    environment); ``base_url`` may point the run at the server's new address.
    """
    out_directory(where.get("out_dir", "runs"))

    with opened_store(where.get("store"), where.get("db"), where.get("schema")) as st:
        old = upgraded_run(st.get_run(run_id))
        if old is not None:
            mechanism = json_object(old.plan.get("mechanism")).get("name")
            raise InvalidAuditInput(
                f"run {run_id} was logged by an older audit of {mechanism}, "
                "which ran to the end or not at all; it has nothing to resume (show or report it)"
            )
        run = st.get_run(run_id)
    plan = AuditPlan.from_public(
        run.plan, admin_token=admin_token, api_key=api_key, base_url=base_url
    )
    if run.design is None:
        raise InvalidAuditInput(f"run {run_id} has no recorded design; it cannot resume")
    design = run_design(run, plan)
    if where.get("target") is None:
        need_context_maker(plan, f"resuming {run_id}")

    async def begin(client: AuditTarget, health: JsonMapping | None, herr: str | None) -> Record:
        def record(st: TrialStore) -> RunContext:
            versions = dict(run.versions)
            resumed = versions.get("resumed")
            resumes: list[JsonValue] = list(resumed) if isinstance(resumed, list) else []
            resumes.append(
                {
                    "at": dt.datetime.now(dt.UTC).isoformat(),
                    "server": dict(health or {"error": herr}),
                }
            )
            versions["resumed"] = resumes
            st.update_run(run_id, versions=versions)
            kind: RunKind = "bootstrap" if run.kind == "bootstrap" else "run"
            console = where.get("console") or _console()
            return RunContext(st, client, run_id, plan, design, kind, console)

        return record

    return await _life(plan, begin, where)
