"""``dpicl-audit``: the auditor's command line.

::

    dpicl-audit run        audit with real queries (flags, or --plan plan.toml plus flags)
    dpicl-audit bootstrap  audit with Algorithm 1 (clean votes + simulated noise)
    dpicl-audit resume RUN continue a run that stopped (killed, failed, interrupted)
    dpicl-audit list       the runs in the trial log
    dpicl-audit show RUN   a run's results table (from the log)
    dpicl-audit estimate   bounds from attack counts obtained elsewhere (JSON)
    dpicl-audit report RUN the report (tables, plots, HTML) of a run

Every command takes ``--db`` (a SQLAlchemy URL or a SQLite file path; default
``sqlite:///runs/audit.db``, or ``DPICL_AUDIT_DB``). Tokens come from flags or the
environment (``DPICL_AUDIT_ADMIN_TOKEN``, ``DPICL_AUDIT_API_KEY``) and are never stored.
Exit status: 0 on success, 1 when the audit fails (the message says why), 2 on bad usage.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from dpicl_audit.errors import AuditError
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import DEFAULT_DB

__all__ = ["app", "main"]

app = typer.Typer(
    name="dpicl-audit",
    help="Black-box and white-box privacy audits of DP-ICL servers over HTTP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

err_console = Console(stderr=True)
out_console = Console()

T = TypeVar("T")

DbOpt = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="DPICL_AUDIT_DB",
        help="Trial log: SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...) or file path.",
    ),
]
OutOpt = Annotated[
    Path, typer.Option("--out", help="Directory for results (<out>/<run>/results.json).")
]
AdminOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-token",
        envvar="DPICL_AUDIT_ADMIN_TOKEN",
        help="Server admin token (creates contexts, white-box endpoints).",
        show_default=False,
    ),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="DPICL_AUDIT_API_KEY",
        help="Server user key for /v1/classify (default: the admin token).",
        show_default=False,
    ),
]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Server base URL.")]
ProgressOpt = Annotated[
    bool, typer.Option("--progress/--no-progress", help="Show progress bars (on stderr).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the results as JSON.")]


def _run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except AuditError as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(1) from exc


def _guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except AuditError as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(1) from exc


def _floats(text: str | None, name: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise typer.BadParameter(f"{name} must be comma-separated numbers, got {text!r}") from exc


def _strings(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [x.strip() for x in text.split(",") if x.strip()]


def _emit(results: dict[str, Any], as_json: bool, path: Path | None = None) -> None:
    from dpicl_audit.runner import _jsonable, print_results

    if as_json:
        sys.stdout.write(json.dumps(_jsonable(results), indent=2) + "\n")
        return
    print_results(results, out_console)
    if path is not None:
        out_console.print(f"results: {path}")


def _audit_command(kind: str) -> Callable[..., None]:
    def command(
        plan: Annotated[
            Path | None, typer.Option("--plan", help="TOML plan; flags override it.")
        ] = None,
        url: UrlOpt = None,
        admin_token: AdminOpt = None,
        api_key: KeyOpt = None,
        dataset: Annotated[
            str | None, typer.Option(help="Bundled name (news-mini), JSONL/CSV path, hf:<name>.")
        ] = None,
        canary: Annotated[str | None, typer.Option(help="natural | mislabeled | random")] = None,
        epsilons: Annotated[
            str | None, typer.Option(help="Comma-separated epsilons, e.g. 1,2,4,8.")
        ] = None,
        delta: Annotated[float | None, typer.Option(help="Per-query delta.")] = None,
        partitions: Annotated[int | None, typer.Option(help="Partitions T.")] = None,
        shots: Annotated[int | None, typer.Option(help="Exemplars per partition.")] = None,
        temperature: Annotated[float | None, typer.Option(help="Vote temperature.")] = None,
        calibration: Annotated[str | None, typer.Option(help="classic | analytic")] = None,
        setting: Annotated[str | None, typer.Option(help="audit-template | deployment")] = None,
        threat_model: Annotated[str | None, typer.Option(help="black-box | white-box")] = None,
        attack: Annotated[
            str | None,
            typer.Option(help="inquery | brainwash (voting) | repeat | reference-vector (ESA)"),
        ] = None,
        mechanism: Annotated[str | None, typer.Option(help="voting | esa")] = None,
        sensitivity: Annotated[str | None, typer.Option(help="ESA: tight | original")] = None,
        candidates: Annotated[int | None, typer.Option(help="ESA: zero-shot candidates.")] = None,
        max_tokens: Annotated[int | None, typer.Option(help="ESA: tokens per answer.")] = None,
        signal: Annotated[
            str | None, typer.Option(help="ESA: a Table 3 signal pair, e.g. clock-foxborough.")
        ] = None,
        y1: Annotated[str | None, typer.Option(help="ESA: own 'present' signal text.")] = None,
        y0: Annotated[str | None, typer.Option(help="ESA: own 'absent' signal text.")] = None,
        embeddings: Annotated[
            str | None, typer.Option(help="ESA: where e(y) comes from: auto | server | local")
        ] = None,
        embedder: Annotated[
            str | None, typer.Option(help="ESA: local sentence-transformers model directory.")
        ] = None,
        trials: Annotated[int | None, typer.Option(help="Trials per epsilon.")] = None,
        confidence: Annotated[float | None, typer.Option(help="e.g. 0.95")] = None,
        seed: Annotated[int | None, typer.Option(help="Seed of the auditor's choices.")] = None,
        concurrency: Annotated[int | None, typer.Option(help="Requests in flight.")] = None,
        timeout: Annotated[float | None, typer.Option(help="Seconds per request.")] = None,
        retries: Annotated[int | None, typer.Option(help="Retries per request.")] = None,
        batch_size: Annotated[int | None, typer.Option(help="Trials per log write.")] = None,
        position: Annotated[int | None, typer.Option(help="Canary position in C1.")] = None,
        partition_seed: Annotated[int | None, typer.Option(help="Shared partition seed.")] = None,
        deploy_labels: Annotated[
            str | None, typer.Option(help="Deployment labels, comma-separated.")
        ] = None,
        deploy_template: Annotated[
            str | None, typer.Option(help="Deployment template with {exemplars}, {query}.")
        ] = None,
        positive: Annotated[str | None, typer.Option(help="Deployment 'present' label.")] = None,
        negative: Annotated[str | None, typer.Option(help="Deployment 'absent' label.")] = None,
        n_llm: Annotated[int | None, typer.Option(help="Bootstrap: clean votes per world.")] = None,
        n_sample: Annotated[
            int | None, typer.Option(help="Bootstrap: simulated trials per world.")
        ] = None,
        name: Annotated[str | None, typer.Option(help="A name for the run.")] = None,
        run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
        db: DbOpt = DEFAULT_DB,
        out: OutOpt = Path("runs"),
        progress: ProgressOpt = True,
        as_json: JsonOpt = False,
    ) -> None:
        from dpicl_audit.runner import bootstrap_audit, run_audit

        overrides: dict[str, Any] = {
            "name": name,
            "target.base_url": url,
            "target.admin_token": admin_token,
            "target.api_key": api_key,
            "dataset": dataset,
            "canary": canary,
            "mechanism.epsilons": _floats(epsilons, "--epsilons"),
            "mechanism.delta": delta,
            "mechanism.partitions": partitions,
            "mechanism.shots": shots,
            "mechanism.temperature": temperature,
            "mechanism.calibration": calibration,
            "mechanism.name": mechanism,
            "mechanism.sensitivity": sensitivity,
            "mechanism.candidates": candidates,
            "mechanism.max_tokens": max_tokens,
            "generation.signal": signal,
            "generation.y1": y1,
            "generation.y0": y0,
            "generation.embeddings": embeddings,
            "generation.embedder": embedder,
            "setting": setting,
            "threat_model": threat_model,
            "attack": attack,
            "trials": trials,
            "confidence": confidence,
            "seed": seed,
            "concurrency": concurrency,
            "timeout": timeout,
            "retries": retries,
            "batch_size": batch_size,
            "neighbour.position": position,
            "neighbour.partition_seed": partition_seed,
            "deployment.labels": _strings(deploy_labels),
            "deployment.template": deploy_template,
            "deployment.positive": positive,
            "deployment.negative": negative,
            "bootstrap.n_llm": n_llm,
            "bootstrap.n_sample": n_sample,
        }
        audit_plan = _guard(lambda: AuditPlan.from_sources(plan, overrides))
        fn = bootstrap_audit if kind == "bootstrap" else run_audit
        results = _run_async(
            fn(
                audit_plan,
                db=db,
                run_id=run_id,
                out_dir=out,
                progress=progress,
                console=err_console,
            )
        )
        _emit(results, as_json, Path(out) / str(results["run_id"]) / "results.json")

    command.__doc__ = (
        "Audit with real queries: C1/C0 contexts per epsilon, trials over HTTP, SQL log."
        if kind == "run"
        else "Audit with Algorithm 1: clean votes from /v1/debug/classify (white-box "
        "internal), then n_sample simulated trials per world, both threat models."
    )
    return command


app.command("run")(_audit_command("run"))
app.command("bootstrap")(_audit_command("bootstrap"))


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
) -> None:
    """Continue a run from its trial log: only missing trials are run, none twice."""
    from dpicl_audit.runner import resume_audit

    results = _run_async(
        resume_audit(
            run_id,
            db=db,
            admin_token=admin_token,
            api_key=api_key,
            base_url=url,
            out_dir=out,
            progress=progress,
            console=err_console,
        )
    )
    _emit(results, as_json, Path(out) / run_id / "results.json")


@app.command("list")
def list_runs(db: DbOpt = DEFAULT_DB, as_json: JsonOpt = False) -> None:
    """The runs in the trial log with their status and progress."""
    from dpicl_audit.store import TrialStore

    def load() -> list[dict[str, Any]]:
        store = TrialStore(db)
        try:
            rows = []
            for run in store.list_runs():
                plan = run.plan
                counts = store.trial_counts(run.id)
                if run.kind == "bootstrap":
                    expected = 2 * int(plan.get("bootstrap", {}).get("n_llm", 0))
                else:
                    expected = int(plan.get("trials", 0)) * len(
                        plan.get("mechanism", {}).get("epsilons", [])
                    )
                rows.append(
                    {
                        "id": run.id,
                        "name": run.name,
                        "kind": run.kind,
                        "status": run.status,
                        "created_at": run.created_at.isoformat(),
                        "threat_model": plan.get("threat_model"),
                        "attack": plan.get("attack"),
                        "epsilons": plan.get("mechanism", {}).get("epsilons"),
                        "trials_logged": sum(counts.values()),
                        "trials_planned": expected,
                        "llm_calls": run.llm_calls,
                        "wall_time_s": run.wall_time_s,
                    }
                )
            return rows
        finally:
            store.dispose()

    rows = _guard(load)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title=f"runs in {db}")
    for col in ("id", "kind", "status", "threat", "attack", "epsilons", "trials", "LLM calls"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["id"],
            r["kind"],
            r["status"],
            str(r["threat_model"]),
            str(r["attack"]),
            ",".join(f"{e:g}" for e in r["epsilons"] or []),
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
    from dpicl_audit.runner import estimate_run
    from dpicl_audit.store import TrialStore

    def load() -> dict[str, Any]:
        store = TrialStore(db)
        try:
            run = store.get_run(run_id)
            if run.results is not None:
                return run.results
            return estimate_run(store, run_id)
        finally:
            store.dispose()

    _emit(_guard(load), as_json)


@app.command()
def estimate(
    tp: Annotated[int, typer.Option("--tp", help="True positives (canary present, called so).")],
    fn: Annotated[int, typer.Option("--fn", help="False negatives.")],
    fp: Annotated[int, typer.Option("--fp", help="False positives.")],
    tn: Annotated[int, typer.Option("--tn", help="True negatives.")],
    delta: Annotated[float, typer.Option("--delta", help="Target delta.")] = 1e-5,
    confidence: Annotated[float, typer.Option("--confidence", help="Joint confidence.")] = 0.95,
) -> None:
    """Lower bounds from attack counts obtained elsewhere, as JSON: mu_lower, epsilon_lower
    (Gaussian-DP) and epsilon_lower_classic (paper 003, Section 2.2)."""
    from dpicl_audit.estimators import estimate_from_counts

    est = _guard(lambda: estimate_from_counts(tp, fn, fp, tn, delta=delta, confidence=confidence))
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
    run_id: Annotated[str, typer.Argument(help="The run to report on.")],
    db: DbOpt = DEFAULT_DB,
    out: Annotated[Path, typer.Option("--out", help="Directory for the report.")] = Path("runs"),
) -> None:
    """Write the run's report (table, HTML with plots) and print where it is."""
    try:
        report_mod = importlib.import_module("dpicl_audit.report")
    except ImportError as exc:
        err_console.print(f"[bold red]error:[/bold red] the report module is unavailable: {exc}")
        raise typer.Exit(1) from exc
    from dpicl_audit.store import resolve_db_url

    where = _guard(lambda: report_mod.write_report(run_id, resolve_db_url(db), out))
    if where is not None:
        out_console.print(f"report: {where}")


@app.command(
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    },
    add_help_option=False,
)
def mozo(ctx: typer.Context) -> None:
    """Black-box DPS-MOZO audit over HTTP (flags: `dpicl-audit mozo --help`)."""
    from dpicl_audit.mozo_audit import main as mozo_main

    raise typer.Exit(mozo_main(list(ctx.args)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
