"""What every ``dpicl-audit`` command shares: the app, common options, error handling."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import typer.core
from rich.console import Console

from dpicl_audit.cli.lazy import LazyGroup
from dpicl_audit.errors import AuditError
from dpicl_audit.jsontypes import JsonMapping, JsonObject

if TYPE_CHECKING:
    from dpicl_audit.plan import AuditPlan

__all__ = [
    "AdminOpt",
    "DbOpt",
    "DeploymentOpt",
    "JsonOpt",
    "KeyOpt",
    "OutOpt",
    "ProfileOpt",
    "ProgressOpt",
    "SplitOpt",
    "StrictOpt",
    "UrlOpt",
    "app",
    "emit",
    "err_console",
    "exit_on_verdict",
    "guard",
    "load_results",
    "out_console",
    "print_verdict",
    "require_log",
]


def _flag_type(self: typer.core.TyperOption, ctx: Any) -> str | None:
    """No ``<bool>`` after an on/off flag (``--json``, ``--progress/--no-progress``,
    ``--help``): a flag takes no value, so a type there reads as if it wanted one."""
    if self.is_flag and self.metavar is None:
        return None
    shown = _option_type(self, ctx)
    if shown is not None and len(shown) > _CHOICES_WIDTH and "|" in shown:
        # A long list of choices wraps between two values, never inside one (issue 45: at
        # 80 columns `<auto|paper|pivotal|identi` / `cal>`): rich breaks lines at spaces.
        shown = shown.replace("|", " | ")
    return shown


#: The widest ``<a|b|c>`` shown as one word in ``--help``; longer ones get spaces.
_CHOICES_WIDTH = 22


_option_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

app = typer.Typer(
    name="dpicl-audit",
    help="Black-box and white-box privacy audits of DP-ICL servers over HTTP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyGroup,  # commands imported when they run (lazy.py): --help stays fast
)


LazyGroup.typer_app = app


@app.callback()
def _group() -> None:
    # A group even before any command is imported (typer makes an app of one command, or
    # none, a bare command).
    pass


err_console = Console(stderr=True)
out_console = Console()

T = TypeVar("T")

DbOpt = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="DPICL_AUDIT_DB",
        help="Trial log: SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...) or file path.",
        show_default=True,
    ),
]
OutOpt = Annotated[
    Path,
    typer.Option(
        "--out", help="Directory for results (<out>/<run>/results.json).", show_default=True
    ),
]
DEFAULT_OUT = Path("runs")
AdminOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-token",
        # The server's own variable too: the README exports DPICL_ADMIN_TOKEN for the server,
        # and a user who did should not be asked for the token again (issue 45).
        envvar=["DPICL_AUDIT_ADMIN_TOKEN", "DPICL_ADMIN_TOKEN"],
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
UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Server base URL. (default: the plan's, or the run's for resume; "
        "http://127.0.0.1:8000 when neither names one)",
    ),
]
ProgressOpt = Annotated[
    bool,
    typer.Option(
        "--progress/--no-progress",
        help="Show progress on stderr: bars on a terminal, a line every few seconds otherwise.",
        show_default=True,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the results as JSON. (default: off, a table)")
]
ProfileOpt = Annotated[
    str,
    typer.Option(
        "--profile",
        show_default=True,
        help="default: the plan as given. "
        "verify (run, voting): also a tail-gap run (paper design, T=3, epsilon 8, "
        "3,000 trials) that sees noise with bounded tails (docs/auditing.md).",
    ),
]
DeploymentOpt = Annotated[
    str | None,
    typer.Option(
        "--deployment",
        help="A deployed context id (or OpenAI model id): its epsilon joins --epsilons' "
        "defaults, its partitions and delta are the plan's, unless given. (default: none)",
    ),
]
SplitOpt = Annotated[
    float | None,
    typer.Option(
        "--split",
        help="White-box: share of the trials that chooses the score threshold, the rest "
        "bound it. (default: the plan's, 0.5)",
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Exit 3 where a figure is INCONCLUSIVE (too few trials for power). (default: "
        "off: such figures are listed with the trials they need and pass; 4 and 5 always fail)",
    ),
]


#: Where ``resume`` reads the admin token from when no ``--admin-token`` is given.
ADMIN_TOKEN_VAR = "DPICL_AUDIT_ADMIN_TOKEN"


def guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except AuditError as exc:
        err_console.print(f"[bold red]error:[/bold red] {exc}")
        raise typer.Exit(1) from exc


def emit(
    results: JsonMapping,
    as_json: bool,
    path: Path | None = None,
    *,
    verdict: bool = False,
    strict: bool = False,
) -> None:
    """A run's results on stdout: as JSON, or its table with each finding once. ``verdict``:
    open with the overall verdict and exit status (``run``, ``resume``; ``show`` judges
    nothing)."""
    from dpicl_audit.pipeline.results import print_results
    from dpicl_audit.results import jsonable

    if as_json:
        sys.stdout.write(json.dumps(jsonable(results), indent=2) + "\n")
        return
    if verdict:
        print_verdict([results], strict, out_console)
    print_results(results, out_console)
    if path is not None:
        out_console.print(f"results: {path}", highlight=False, soft_wrap=True)


_VERDICT_STYLE = {
    "violation": "bold red",
    "bug": "bold yellow",
    "nonconforming": "bold yellow",
    "ok": "bold green",
}


def print_verdict(results: Sequence[JsonMapping], strict: bool, console: Console) -> None:
    """The one line that opens a summary: the runs' overall verdict and exit status."""
    from rich.text import Text

    from dpicl_audit.results.overall import overall_verdict

    overall = overall_verdict(results, strict=strict)
    status = "" if overall.status is None else overall.status.value
    console.print(Text(overall.line, style=_VERDICT_STYLE.get(status, "bold")))


def exit_on_verdict(
    results: Sequence[JsonMapping], strict: bool = False, *, printed: bool = True
) -> None:
    """Exit with the worst verdict's code (verdicts.EXIT_CODES: 4 NONCONFORMING, 5 VIOLATION
    or BUG; 3 INCONCLUSIVE only under ``--strict``), so that a deployment pipeline can fail
    on it. ``printed``: the summary on stdout already opened with the verdict and listed
    each figure without power; else (``--json``) the verdict and those figures go to stderr,
    once."""
    from dpicl_audit.results import refused_trials, results_exit_code, underpowered

    for line in refused_trials(results):
        err_console.print(f"[bold red]error:[/bold red] {line}", soft_wrap=True, highlight=False)
    if not printed:
        print_verdict(results, strict, err_console)
        for line in underpowered(results):
            err_console.print(f"[yellow]  {line}[/yellow]", highlight=False)
    code = results_exit_code(results, strict=strict)
    if code:
        raise typer.Exit(code)


def require_log(db: str, run_id: str | None = None) -> None:
    """Refuse to read a SQLite trial log that does not exist (and so never create it)."""
    from dpicl_audit.store.db import sqlite_file_missing

    missing = sqlite_file_missing(db)
    if missing is not None:
        what = f"no run {run_id!r}: " if run_id else ""
        err_console.print(f"[bold red]error:[/bold red] {what}there is no trial log at {missing}")
        raise typer.Exit(1)


def load_results(db: str, run_id: str) -> JsonObject:
    """A run's results: as stored, else recomputed from its log."""
    from dpicl_audit.pipeline.estimation import estimate_run, load_run
    from dpicl_audit.store import TrialStore

    store = TrialStore(db)
    try:
        run = load_run(store, run_id)
        if run.results is not None:
            return dict(run.results)
        return estimate_run(store, run_id).to_json()
    finally:
        store.dispose()


def trials_from_option(kind: str, boot: str, trials: int | None, db: str, plan: AuditPlan) -> int:
    """``--trials-from``: a run's trials per epsilon from a bootstrap's planning figure."""
    from dpicl_audit.estimators.trial_budget import trials_from_bootstrap

    if kind != "run" or trials is not None:
        what = "only for run" if kind != "run" else "give it or --trials, not both"
        err_console.print(f"[bold red]error:[/bold red] --trials-from: {what}")
        raise typer.Exit(2)
    require_log(db, boot)
    results = guard(lambda: load_results(db, boot))
    n = guard(
        lambda: trials_from_bootstrap(
            results,
            mechanism=plan.mechanism.name,
            epsilons=plan.mechanism.epsilons,
            confidence=plan.confidence,
            split=plan.split,
        )
    )
    err_console.print(f"{n:,} trials per epsilon: what the bootstrap {boot!r} needs for power")
    return n
