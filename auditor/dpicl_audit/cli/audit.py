"""``dpicl-audit run`` and ``dpicl-audit bootstrap``: a plan from flags (and ``--plan``).

Every flag overrides the plan's value; ``--help`` shows the plan's default of each (a flag
left out keeps the TOML file's value, else that default).
"""

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dpicl_audit.cli.audit_options import audit_parameters, plan_overrides
from dpicl_audit.cli.common import (
    app,
    emit,
    err_console,
    exit_on_verdict,
    guard,
    out_console,
    print_verdict,
    trials_from_option,
)
from dpicl_audit.cli.stopping import once_logged, resume_command, run_async
from dpicl_audit.plan import AuditPlan

# The mechanisms' modules (DPS-MOZO's, ESA's, dp-accounting under them) are imported by the
# runner when a command runs, not here: `--help` reads only the plan's types and defaults.

__all__ = ["audit_command"]

_DOCS = {
    "run": "Audit with real queries: C1/C0 contexts per epsilon, trials over HTTP, SQL log.",
    "bootstrap": "Audit with Algorithm 1: clean votes from /v1/debug/classify (white-box "
    "internal), then n_sample simulated trials per world, both threat models.",
}


def audit_command(kind: str) -> Callable[..., None]:
    """``run`` or ``bootstrap``: its options (audit_options.py, one panel per group) and body."""

    def command(**values: Any) -> None:
        _audit(kind, values)

    command.__signature__ = inspect.Signature(audit_parameters(kind))  # type: ignore[attr-defined]
    command.__doc__ = _DOCS[kind]
    return command


def _build_plan(kind: str, values: Mapping[str, Any]) -> AuditPlan:
    """The plan from ``--plan`` and the flags (``--trials-from`` read from its bootstrap)."""
    plan, overrides = values["plan"], plan_overrides(values)
    audit_plan = guard(lambda: AuditPlan.from_sources(plan, overrides))
    if values["trials_from"] is not None:
        overrides["trials"] = trials_from_option(
            kind, values["trials_from"], values["trials"], values["db"], audit_plan
        )
        audit_plan = guard(lambda: AuditPlan.from_sources(plan, overrides))
    return audit_plan


def _audit(kind: str, values: Mapping[str, Any]) -> None:
    from dpicl_audit.pipeline.profiles import companion_plan, tail_run_id
    from dpicl_audit.pipeline.results import record_tail_gap
    from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
    from dpicl_audit.plan.schedule import new_run_id

    audit_plan = _build_plan(kind, values)
    db, out, progress = values["db"], values["out"], values["progress"]
    fn = bootstrap_audit if kind == "bootstrap" else run_audit
    # The id is fixed here, not by the runner, so that Ctrl-C can say what to resume.
    rid = values["run_id"] or new_run_id()
    results = run_async(
        fn(audit_plan, db=db, run_id=rid, out_dir=out, progress=progress, console=err_console),
        resume_hint=once_logged(db, rid, resume_command(rid, db)),
    )
    runs = [results]
    companion = guard(lambda: companion_plan(values["profile"], kind, audit_plan))
    if companion is not None:  # --profile verify: the tail-gap run (profiles.py)
        tail_id = tail_run_id(str(results["run_id"]))
        tail = run_async(run_audit(companion, db=db, run_id=tail_id, out_dir=out,
                                   progress=progress, console=err_console))  # fmt: skip
        # One JSON document, stored with the run: the companion inside the run's.
        runs = [guard(lambda: record_tail_gap(db, results, tail, out)), tail]
    as_json, strict = values["as_json"], values["strict"]
    if not as_json:  # one line first: the verdict of the run (and its companion)
        print_verdict(runs, strict, out_console)
    for res in runs[: 1 if as_json else 2]:
        emit(res, as_json, Path(out) / str(res["run_id"]) / "results.json")
    exit_on_verdict(runs, strict, printed=not as_json)


app.command("run")(audit_command("run"))
app.command("bootstrap")(audit_command("bootstrap"))
