"""Commands over the trial log: ``resume``, ``list``, ``show``, ``report``, ``estimate``.

``list``, ``show`` and ``report`` only read: on a SQLite path that does not exist they say
so instead of creating an empty trial log.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Required, TypedDict

import typer
from rich import box
from rich.table import Table

from dpicl_audit.cli.common import (
    AdminOpt,
    DbOpt,
    JsonOpt,
    KeyOpt,
    OutOpt,
    ProgressOpt,
    StrictOpt,
    UrlOpt,
    app,
    emit,
    err_console,
    exit_on_verdict,
    guard,
    load_results,
    out_console,
    require_log,
)
from dpicl_audit.cli.stopping import resume_command, run_async
from dpicl_audit.errors import AuditError
from dpicl_audit.jsontypes import (
    JsonMapping,
    JsonObject,
    JsonValue,
    json_int,
    json_list,
    json_object,
)
from dpicl_audit.store.db import DEFAULT_DB, resolve_db_url, sqlite_file_missing

__all__ = ["list_runs", "report", "resume", "show"]


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    url: UrlOpt = None,
    admin_token: AdminOpt = None,
    api_key: KeyOpt = None,
    db: DbOpt = DEFAULT_DB,
    out: OutOpt = Path("runs"),
    progress: ProgressOpt = True,
    as_json: JsonOpt = False,
    strict: StrictOpt = False,
) -> None:
    """Continue a run from its trial log: only missing trials are run, none twice."""
    from dpicl_audit.pipeline.run import resume_audit

    require_log(db, run_id)
    results = run_async(
        resume_audit(
            run_id,
            db=db,
            admin_token=admin_token,
            api_key=api_key,
            base_url=url,
            out_dir=out,
            progress=progress,
            console=err_console,
        ),
        resume_hint=resume_command(run_id, db),
    )
    emit(results, as_json, Path(out) / run_id / "results.json", verdict=True, strict=strict)
    exit_on_verdict([results], strict, printed=not as_json)  # a resumed run ends like ``run``


class _RunRow(TypedDict, total=False):
    """A run's row of ``list`` (``--json`` writes the rows as they are)."""

    id: Required[str]
    name: Required[str | None]
    mechanism: Required[str]
    kind: Required[str]
    status: Required[str]
    created_at: Required[str]
    threat_model: Required[str | None]
    attack: Required[str | None]
    #: Utility runs: the dataset and the grid's partitions.
    dataset: str
    api: Required[str]
    epsilons: Required[list[float] | None]
    partitions: list[int]
    trials_logged: Required[int]
    trials_planned: Required[int]
    llm_calls: Required[int]
    wall_time_s: Required[float]


def _expected(run: Any, plan: JsonMapping) -> int:
    if run.kind == "bootstrap":
        return 2 * json_int(json_object(plan.get("bootstrap")).get("n_llm", 0))
    epsilons = json_list(json_object(plan.get("mechanism")).get("epsilons"))
    return json_int(plan.get("trials", 0)) * len(epsilons)


def _text(value: JsonValue) -> str | None:
    return None if value is None else str(value)


def _numbers(value: JsonValue) -> list[float] | None:
    """A stored list of epsilons, its numbers as stored (None where there is no list)."""
    return [v for v in value if isinstance(v, int | float)] if isinstance(value, list) else None


def _utility_row(run: Any, logged: int) -> _RunRow:
    """A utility run's row of ``list``: its plan is a grid of cells over a dataset, not an
    audit's mechanism, attack and threat model (it was listed as a black-box voting inquery
    audit of no epsilon, with 0 trials planned)."""
    from dpicl_audit.utility.plan import UtilityPlan

    plan = UtilityPlan.model_validate(run.plan | {"target": {}})
    # A baseline the endpoint did not offer asks nothing: it is not planned.
    refused = (run.results or {}).get("refused") or {}
    cells = [c for c in plan.cells() if c.name not in refused]
    return {
        "id": run.id,
        "name": run.name,
        "mechanism": plan.mechanism,
        "kind": run.kind,
        "status": run.status,
        "created_at": run.created_at.isoformat(),
        "threat_model": None,
        "attack": None,
        "dataset": plan.dataset,
        "api": (run.plan.get("target") or {}).get("api", "native"),
        "epsilons": list(plan.epsilons),
        "partitions": list(plan.partitions),
        "trials_logged": logged,
        "trials_planned": plan.queries * len(cells),
        "llm_calls": run.llm_calls,
        "wall_time_s": run.wall_time_s,
    }


@app.command("list")
def list_runs(db: DbOpt = DEFAULT_DB, as_json: JsonOpt = False) -> None:
    """The runs in the trial log: mechanism, kind, status and progress."""
    from dpicl_audit.catalog.mechanisms import default_mechanism_name
    from dpicl_audit.mechanisms.registry import upgraded_run
    from dpicl_audit.store import TrialStore

    missing = sqlite_file_missing(db)
    if missing is not None:
        if as_json:
            sys.stdout.write("[]\n")
        else:
            out_console.print(f"no trial log at {missing} (nothing has been audited there yet)")
        return

    def load() -> list[_RunRow]:
        store = TrialStore(db)
        try:
            rows: list[_RunRow] = []
            for stored in store.list_runs():
                run = upgraded_run(stored) or stored
                plan = run.plan
                mech = json_object(plan.get("mechanism"))
                if run.kind == "utility":
                    rows.append(_utility_row(run, sum(store.trial_counts(run.id).values())))
                    continue
                rows.append(
                    {
                        "id": run.id,
                        "name": run.name,
                        "mechanism": str(mech.get("name", default_mechanism_name())),
                        "kind": run.kind,
                        "status": run.status,
                        "created_at": run.created_at.isoformat(),
                        "threat_model": _text(plan.get("threat_model", "black-box")),
                        "attack": _text(plan.get("attack", "inquery")),
                        "api": str(json_object(plan.get("target")).get("api", "native")),
                        "epsilons": _numbers(mech.get("epsilons")),
                        "trials_logged": sum(store.trial_counts(run.id).values()),
                        "trials_planned": _expected(run, plan),
                        "llm_calls": run.llm_calls,
                        "wall_time_s": run.wall_time_s,
                    }
                )
            return rows
        finally:
            store.dispose()

    rows = guard(load)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    # Fits 80 columns: the run id is never wrapped (a wrapped id cannot be copied into
    # `show`/`resume`); the description column takes what is left and wraps.
    table = Table(title=f"runs in {db}", box=box.SIMPLE_HEAD, pad_edge=False)
    width = max([len(r["id"]) for r in rows] + [3])
    table.add_column("run", no_wrap=True, min_width=width, max_width=width)
    table.add_column("what", overflow="fold", ratio=1)
    for col in ("status", "trials", "calls"):
        table.add_column(col, no_wrap=True, justify="left" if col == "status" else "right")
    for r in rows:
        eps = ",".join(f"{e:g}" for e in r["epsilons"] or [])
        threat = "both threat models" if r["kind"] == "bootstrap" else r["threat_model"]
        what = f"{r['mechanism']} · {r['attack']} · {r['kind']} · {threat} · ε {eps}"
        if r["kind"] == "utility":
            ts = ",".join(str(t) for t in r["partitions"] or [])
            what = f"utility · {r['mechanism']} on {r['dataset']} · ε {eps} · T {ts}"
        if r.get("api") == "openai":  # native and OpenAI runs were listed alike (issue 45)
            what += " · OpenAI API"
        name = r["name"] or ""
        if len(name) > width:
            name = name[: width - 1] + "…"
        table.add_row(
            r["id"] + (f"\n{name}" if name else ""),
            what,
            r["status"],
            f"{r['trials_logged']}/{r['trials_planned']}",
            str(r["llm_calls"]),
        )
    out_console.print(table)


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.")],
    db: DbOpt = DEFAULT_DB,
    as_json: JsonOpt = False,
) -> None:
    """A run's results (recomputed from the log when it has none stored yet)."""
    require_log(db, run_id)
    emit(guard(lambda: load_results(db, run_id)), as_json)


@app.command()
def estimate(
    tp: Annotated[int, typer.Option("--tp", help="True positives (canary present, called so).")],
    fn: Annotated[int, typer.Option("--fn", help="False negatives.")],
    fp: Annotated[int, typer.Option("--fp", help="False positives.")],
    tn: Annotated[int, typer.Option("--tn", help="True negatives.")],
    delta: Annotated[
        float, typer.Option("--delta", help="Target delta.", show_default=True)
    ] = 1e-5,
    confidence: Annotated[
        float, typer.Option("--confidence", help="Joint confidence.", show_default=True)
    ] = 0.95,
) -> None:
    """Lower bounds from attack counts obtained elsewhere, as JSON: mu_lower, epsilon_lower
    (Gaussian-DP) and epsilon_lower_classic (paper 003, Section 2.2)."""
    from dpicl_audit.estimators.counts import estimate_from_counts

    est = guard(lambda: estimate_from_counts(tp, fn, fp, tn, delta=delta, confidence=confidence))
    out = est.to_dict()
    payload = {
        "mu_lower": out["mu_lower"],
        "epsilon_lower": out["epsilon_lower"],
        "epsilon_lower_classic": out["epsilon_lower_classic"],
        **{k: v for k, v in out.items() if k not in ("mu_lower", "epsilon_lower")},
    }
    payload = {
        k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in payload.items()
    }
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")


@app.command()
def report(
    run_ids: Annotated[list[str], typer.Argument(help="One or more runs, reported together.")],
    db: DbOpt = DEFAULT_DB,
    out: Annotated[
        Path, typer.Option("--out", help="Directory for the report.", show_default=True)
    ] = Path("runs"),
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print where the report is and each run's verdict as JSON (the table goes "
            "to stderr). (default: off, the table)",
        ),
    ] = False,
    strict: StrictOpt = False,
) -> None:
    """Write one report (table, HTML with plots) of the runs and print where it is."""
    try:
        report_mod = importlib.import_module("dpicl_audit.report")
    except ImportError as exc:
        err_console.print(f"[bold red]error:[/bold red] the report module is unavailable: {exc}")
        raise typer.Exit(1) from exc
    require_log(db, run_ids[0] if len(run_ids) == 1 else None)
    ids: str | list[str] = run_ids[0] if len(run_ids) == 1 else list(run_ids)
    # --json: the table goes to stderr, so stdout holds the JSON alone
    extra = {"console": err_console} if as_json else {}
    where = guard(
        lambda: report_mod.write_report(ids, resolve_db_url(db), out, strict=strict, **extra)
    )
    if as_json:
        data = json.loads((Path(where).parent / "report.json").read_text(encoding="utf-8"))
        payload = {
            "html": str(where),
            "json": str(Path(where).parent / "report.json"),
            "verdicts": data.get("verdicts", {}),
        }
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    elif where is not None:
        out_console.print(f"report: {where}", highlight=False, soft_wrap=True)
    # The report opened with the verdict and listed each finding (on stderr with --json).
    exit_on_verdict(_reported_results(db, run_ids), strict)


def _reported_results(db: str, run_ids: list[str]) -> list[JsonObject]:
    """The reported runs' results, for the exit code (a run the log cannot give is skipped:
    the report itself has said what it could of it)."""

    out = []
    for r in run_ids:
        try:
            results = load_results(db, r)
        except AuditError:
            continue
        if results.get("kind") != "utility":  # a utility run has no verdict
            out.append(results)
    return out
