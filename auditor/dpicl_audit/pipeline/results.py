"""Results of a run: the JSON written beside it, and the table printed after it.

Every table row names the mechanism, the attack, the design (canary kind, setting) and the
threat model, so rows of different runs can be told apart on their own. The report
(:mod:`dpicl_audit.report`) builds richer views from the same results.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dpicl_audit.catalog.mechanisms import default_mechanism_name
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.pipeline.profiles import with_tail_gap
from dpicl_audit.results import RunResult, jsonable
from dpicl_audit.store import TrialStore
from dpicl_audit.verdicts import Status

__all__ = [
    "describe_run",
    "finish_run",
    "out_directory",
    "print_results",
    "results_table",
    "write_results",
]


def describe_run(results: JsonMapping) -> str:
    """``mechanism · attack · design · kind``, e.g. ``voting · inquery · natural canary,
    audit-template · bootstrap``."""
    run = RunResult.from_json(results)
    plan, design = run.get("plan") or {}, run.design
    stored = (plan.get("mechanism") or {}).get("name", default_mechanism_name())
    mech = run.get("mechanism") or stored  # a legacy log's object too, as stored
    attack = design.get("attack") or plan.get("attack", "?")
    canary = design.get("canary_kind") or plan.get("canary", "?")
    setting = plan.get("setting", "audit-template")
    kind = "bootstrap" if run.kind == "bootstrap" else "real trials"
    return f"{mech} · {attack} · {canary} canary, {setting} · {kind}"


def finish_run(store: TrialStore, run_id: str, results: RunResult) -> JsonObject:
    """Store a run's results as completed, with its final usage; the JSON stored (the edge
    between the typed results and their JSON, issue 28)."""
    store.update_run(run_id, status="completed", results=jsonable(results.to_json()))
    run = store.get_run(run_id)
    results = replace(
        results,
        status=run.status,
        queries=run.queries,
        llm_calls=run.llm_calls,
        wall_time_s=run.wall_time_s,
    )
    stored = jsonable(results.to_json())
    store.update_run(run_id, results=stored)
    return stored  # type: ignore[no-any-return]


def record_tail_gap(
    db: str, results: JsonMapping, tail: JsonMapping, out_dir: str | Path
) -> JsonObject:
    """A ``--profile verify`` run's results with its tail-gap companion's inside
    (profiles.with_tail_gap), stored with the run and written to its ``results.json``: what
    the audit prints is what ``show`` and ``report`` give back."""
    both = with_tail_gap(results, tail)
    store = TrialStore(db)
    try:
        store.update_run(str(results["run_id"]), results=jsonable(both))
    finally:
        store.dispose()
    write_results(both, out_dir)
    return both


def out_directory(path: str | Path) -> Path:
    """``path`` as a directory, created if need be; :class:`InvalidAuditInput` naming it
    when it cannot be one. Runs call it before they start, so an --out that is a file does
    not fail (with a traceback) only when the audit's results are written."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InvalidAuditInput(f"--out {str(out)!r} is a file, not a directory") from None
    except OSError as exc:
        raise InvalidAuditInput(
            f"--out {str(out)!r} cannot be a directory: {exc.strerror}"
            + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(out) else "")
        ) from None
    return out


def write_results(results: JsonMapping, out_dir: str | Path) -> Path:
    """``<out_dir>/<run_id>/results.json``."""
    path = out_directory(Path(out_dir) / str(results["run_id"])) / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(jsonable(results), indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    v = float(value)
    if math.isinf(v):
        return "inf"
    return f"{v:.{digits}f}"


def results_table(results: JsonMapping) -> Table:
    """One row per (epsilon, threat model); fits an 80-column terminal."""
    run = RunResult.from_json(results)
    conf = 0.95 if run.confidence is None else run.confidence
    table = Table(
        title=f"dpicl audit {run.run_id}\n{describe_run(results)}",
        caption=(
            "ε: as configured; exact: the mechanism's true ε (PLD)\n"
            f"ε emp: GDP figure (assumes a Gaussian trade-off); classic: assumption-free bound "
            f"(its own threshold); both at {conf:.0%} confidence, δ={results.get('delta')}\n"
            "white-box: the better of the black-box rule and a held-out threshold"
        ),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    columns = (
        ("ε", "left"),
        ("threat", "left"),
        ("exact", "right"),
        ("ε emp", "right"),
        ("μ low", "right"),
        ("classic", "right"),
        ("TPR", "right"),
        ("FPR", "right"),
        ("n", "right"),
        ("verdict", "left"),
    )
    for col, justify in columns:
        # The verdict keeps its full width (12: "INCONCLUSIVE"); when 80 columns are too few
        # the numbers give way first.
        table.add_column(
            col,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            min_width=12 if col == "verdict" else None,
        )
    models = run.threat_models if "threat_models" in run.extra else ["black-box"]
    for s in run.settings:
        for model in models:
            est = s.estimate("black_box" if model == "black-box" else "white_box")
            if est is None or not est.keys:
                continue
            threat = model.removesuffix("-box")
            eps = f"{float(s.epsilon_theory or 0.0):g}"
            if est.error is not None:
                table.add_row(eps, threat, *["-"] * 7, Text(est.error, style="red"))
                continue
            status = "" if est.verdict is None else est.verdict.status.value
            style = {
                "violation": "bold red",
                "bug": "bold yellow",
                "nonconforming": "bold yellow",
                "ok": "green",
            }.get(status, "")
            status = {
                "inconclusive": "INCONCLUSIVE",
                "nonconforming": "NONCONFORMING",
                "ok": "consistent",
            }.get(status, status)
            table.add_row(
                eps,
                threat,
                _fmt(s.epsilon_exact),
                _fmt(est.epsilon_shown),
                _fmt(est.mu_lower),
                _fmt(est.epsilon_lower_classic),
                _fmt(est.tpr, 2),
                _fmt(est.fpr, 2),
                str(s.trials if "trials" in s.keys else "-"),
                Text(status, style=style),
            )
    return table


def print_results(results: JsonMapping, console: Console | None = None) -> None:
    console = console or Console()
    console.print(results_table(results))
    run = RunResult.from_json(results)
    for s in run.settings:
        for key in ("black_box", "white_box"):
            est = s.estimate(key)
            found = None if est is None else est.verdict
            if found is not None and found.status.order > Status.OK.order:
                colour = "bold red" if found.status is not Status.INCONCLUSIVE else "yellow"
                console.print(
                    f"[{colour}]{s.setting} {key.replace('_', '-')}: {found.message}[/{colour}]"
                )
    needs = [(s.setting, s.extra.get("real_trials_for_power")) for s in run.settings]
    if run.kind == "bootstrap" and any(n is not None for _, n in needs):
        console.print(
            "real trials a run of this design needs for power (about, both worlds): "
            + ", ".join(f"{k}: {'no count' if n is None else f'{n:,}'}" for k, n in needs)
        )
    for s in run.settings:
        if s.rdp is not None:  # paper 003's RDP audit
            rdp, found = s.rdp, s.rdp_verdict
            eps = rdp.get("epsilons", {})
            style = "bold red" if found is not None and found.flags else "green"
            console.print(
                f"{s.setting} RDP over {rdp.get('queries')} queries, ε via Theorem 1 at "
                f"δ={eps.get('delta')}: theory {_fmt(eps.get('theory'))}, exact "
                f"{_fmt(eps.get('exact'))}, k-cut {_fmt(eps.get('k_cut'))}, 2-cut "
                f"{_fmt(eps.get('two_cut'))} [{style}]{'' if found is None else found.message}"
                f"[/{style}]"
            )
    took = run.probe_wall_time_s
    for name, section, adds in run.probes():  # the audits from outside (probes.registry.PROBES)
        ok = section.get("status") == "ok"
        colour = "green" if ok else "yellow" if adds is None else "bold red"
        when = f" ({took[name]:.1f} s)" if name in took else ""
        console.print(f"[{colour}]{name}{when}: {section.get('message', '')}[/{colour}]")
    if run.probes_left_out:
        console.print(
            f"[yellow]left out by the plan (--probes): {', '.join(run.probes_left_out)}; the "
            "run could not have seen what they see[/yellow]"
        )
    console.print(
        f"{results.get('queries', 0)} queries, {results.get('llm_calls', 0)} LLM calls, "
        f"{_fmt(results.get('wall_time_s'), 1)} s wall time"
    )
