"""``dpicl-audit utility``: the privacy-utility audit of a deployment (docs/utility.md).

A new run from flags, or ``--resume RUN`` to continue one from its trial log (tokens again
from flags or the environment: they are never stored). Exit status 0 when the run completed,
1 when it failed (the message says why), 2 on bad usage, 130 on Ctrl-C (the line printed says
how to resume).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dpicl_audit.cli.common import (
    AdminOpt,
    DbOpt,
    KeyOpt,
    OutOpt,
    ProgressOpt,
    UrlOpt,
    app,
    err_console,
    guard,
    out_console,
)
from dpicl_audit.cli.common import JsonOpt as _JsonOpt
from dpicl_audit.cli.flags import parse_floats
from dpicl_audit.cli.stopping import db_option, once_logged, run_async
from dpicl_audit.store.db import DEFAULT_DB

if TYPE_CHECKING:
    from dpicl_audit.utility.plan import UtilityPlan
    from dpicl_audit.utility.results import UtilityResults

__all__ = ["utility"]

_DEFAULT_OUT = Path("runs")


LabelCalibrationOpt = Annotated[
    str | None,
    typer.Option(
        help="Voting: none | content-free | exemplars (calibration of each partition's label "
        "scores: by the content-free input 'N/A', Zhao et al. 2021, or by the partition's "
        "own exemplars, Zhou et al. 2024; the few-shot baseline too, zero-shot under "
        "content-free only). (default: exemplars)"
    ),
]


def _ints(text: str | None) -> list[int] | None:
    vals = parse_floats(text, "--partitions")
    if vals is None:
        return None
    if any(v != int(v) for v in vals):
        raise typer.BadParameter(f"--partitions must be whole numbers, got {text!r}")
    return [int(v) for v in vals]


def _new_plan(
    flags: Mapping[str, object], target: Mapping[str, str | None], baselines: bool
) -> UtilityPlan:
    """A new run's plan from the flags given; exit 2 naming the first bad value."""
    from pydantic import ValidationError

    from dpicl_audit.utility.plan import UtilityPlan

    try:
        plan = UtilityPlan.model_validate(
            {k: v for k, v in flags.items() if v is not None}
            | {"baselines": baselines, "target": {k: v for k, v in target.items() if v}}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "plan"
        msg = str(first["msg"]).removeprefix("Value error, ")
        # A choice's message lists the choices, not what was given: name that too.
        got = f" (got {first['input']!r})" if first["type"] == "literal_error" else ""
        err_console.print(f"[bold red]error:[/bold red] {where}: {msg}{got}", highlight=False)
        raise typer.Exit(2) from None
    if plan.target.admin_token is None and plan.target.context_hook is None:
        err_console.print(
            "[bold red]error:[/bold red] the utility audit creates contexts: give "
            "--admin-token (or export DPICL_AUDIT_ADMIN_TOKEN or DPICL_ADMIN_TOKEN), or --api "
            "openai --context-hook"
        )
        raise typer.Exit(2)
    return plan


def _resumed(resume: str, flags: Mapping[str, object]) -> str:
    """``--resume RUN``: the run's id; exit 2 where a flag would change its stored plan."""
    given = [f"--{k.replace('_', '-')}" for k, v in flags.items() if v is not None]
    if given:
        err_console.print(
            f"[bold red]error:[/bold red] --resume continues the stored plan; drop {given}"
        )
        raise typer.Exit(2)
    return resume


@app.command()
def utility(
    dataset: Annotated[
        str | None,
        typer.Option(
            help="A bundled set (reviews-mini, news-mini, dialogsum-mini: generation), "
            "bbc-news, or a JSONL/CSV file with input/output. (default: reviews-mini)"
        ),
    ] = None,
    epsilons: Annotated[
        str | None, typer.Option(help="Per-answer epsilons, comma-separated. (default: 1,2,4,8)")
    ] = None,
    partitions: Annotated[
        str | None, typer.Option(help="Partition counts T, comma-separated. (default: 4)")
    ] = None,
    queries: Annotated[
        int | None,
        typer.Option(
            help="Held-out queries per cell. (default: 100: every 95% interval at most 0.20 wide)"
        ),
    ] = None,
    exemplars: Annotated[
        int | None, typer.Option(help="Exemplars per context. (default: 16)")
    ] = None,
    contexts: Annotated[
        int | None,
        typer.Option(
            help="Exemplar draws (contexts per cell; more where one budget cannot hold a "
            "context's answers). (default: 4)"
        ),
    ] = None,
    delta: Annotated[float | None, typer.Option(help="Per-answer delta. (default: 1e-05)")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Generation: tokens per answer. (default: the server's)")
    ] = None,
    label_calibration: LabelCalibrationOpt = None,
    baselines: Annotated[
        bool,
        typer.Option(
            "--baselines/--no-baselines", help="Measure the zero-shot and non-private baselines."
        ),
    ] = True,
    baseline_url: Annotated[
        str | None,
        typer.Option(
            help="A dpicl server over the same model for the baselines (DPICL_WHITEBOX="
            "internal for the non-private one). (default: the target, on dpicl's routes)"
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the draws. (default: 2026)")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Queries in flight. (default: 4)")] = None,
    url: UrlOpt = None,
    admin_token: AdminOpt = None,
    api_key: KeyOpt = None,
    api: Annotated[
        str | None,
        typer.Option(help="native: dpicl's routes | openai: chat completions. (default: native)"),
    ] = None,
    context_hook: Annotated[
        str | None,
        typer.Option(
            help="With --api openai: module:function or a command that creates each context "
            "(JSON on stdin) and returns the model id. (default: none)"
        ),
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue this utility run from its log.")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option(help="Name of a new run. (default: generated)")
    ] = None,
    db: DbOpt = DEFAULT_DB,
    out: OutOpt = _DEFAULT_OUT,
    progress: ProgressOpt = True,
    as_json: _JsonOpt = False,
) -> None:
    """Accuracy (or ROUGE-L) per epsilon and T with 95% intervals, beside the zero-shot and
    non-private baselines and the budget the ledger says the evaluation spent."""
    from dpicl_audit.plan.schedule import check_run_id, new_run_id
    from dpicl_audit.store import TrialStore
    from dpicl_audit.utility.runner import run_utility

    target: dict[str, str | None] = {
        "base_url": url,
        "admin_token": admin_token,
        "api_key": api_key,
        "api": api,
        "context_hook": context_hook,
    }
    flags: dict[str, object] = {
        "dataset": dataset,
        "epsilons": parse_floats(epsilons, "--epsilons"),
        "partitions": _ints(partitions),
        "queries": queries,
        "exemplars": exemplars,
        "contexts": contexts,
        "delta": delta,
        "max_tokens": max_tokens,
        "label_calibration": label_calibration,
        "baseline_url": baseline_url,
        "seed": seed,
        "concurrency": concurrency,
    }
    if resume is None:
        plan: UtilityPlan | None = _new_plan(flags, target, baselines)
        rid = guard(lambda: check_run_id(run_id or new_run_id().replace("audit-", "utility-")))
    else:
        plan, rid = None, _resumed(resume, flags)
    credentials = {"base_url": url, "admin_token": admin_token, "api_key": api_key}
    store = guard(lambda: TrialStore(db))
    try:
        results = run_async(
            run_utility(plan, store=store, run_id=rid, console=err_console, progress=progress,
                        resume=resume is not None, overrides=credentials),
            resume_hint=once_logged(db, rid, f"dpicl-audit utility --resume {rid}{db_option(db)}"),
        )  # fmt: skip
    finally:
        store.dispose()
    _write(results, Path(out) / rid / "utility.json", as_json)


def _write(results: UtilityResults, path: Path, as_json: bool) -> None:
    """The results to ``path`` (utility.json), then printed: as JSON or as the table."""
    from dpicl_audit.utility.report import print_utility

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    if as_json:
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
        return
    print_utility(results, out_console)
    out_console.print(f"results: {path}", highlight=False, soft_wrap=True)
