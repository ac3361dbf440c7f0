"""Writing a report: ``report.html``, ``report.json`` and the table.

One JSON per report: ``report.json`` (the table rows, every run's results, the verdicts).
A combined report used to write the same bytes again as ``results.json``; that copy is
gone. A single run's ``<out>/<run>/results.json`` is another file, the runner's results,
which the report refreshes."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.pipeline.results import out_directory, write_results
from dpicl_audit.report.curves import trials_curve
from dpicl_audit.report.data import ReportRow, RunData, load_runs
from dpicl_audit.report.html import render_html
from dpicl_audit.report.plots import plot_epsilons, plot_tradeoff, plot_trials, run_colors
from dpicl_audit.report.rdp import has_rdp, plot_rdp_bars, plot_rdp_curves
from dpicl_audit.report.rows import report_rows
from dpicl_audit.report.table import print_report_table, run_keys
from dpicl_audit.report.utility_card import utility_card
from dpicl_audit.report.words import eps_label, noise_findings, run_verdict, verdict_sentence
from dpicl_audit.results import jsonable
from dpicl_audit.results.overall import overall_verdict
from dpicl_audit.store import TrialStore
from dpicl_audit.utility.report import print_utility, utility_results

__all__ = ["write_combined_report", "write_report"]


def _payload(
    title: str, runs: Sequence[RunData], rows: Sequence[ReportRow], notes: Sequence[str]
) -> dict[str, object]:
    return {
        "title": title,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "notes": list(notes),
        "verdicts": {
            rd.run_id: run_verdict([r for r in rows if r.run_id == rd.run_id], rd.probe_statuses)
            for rd in runs
        },
        "rows": [r.to_dict() for r in rows],
        "runs": {rd.run_id: rd.results.to_json() for rd in runs},
    }


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


#: What a point of the trials plots is, and is not: the run's claims are the table's
#: figures, which hold for its tests together; a curve of a figure recomputed on growing
#: prefixes of the same trials is read many times over, so a point is no claim.
_CURVE_POINTS = (
    "Each point is the figure alone, at the run's confidence, on that many trials; the "
    "points share their trials and are not corrected for one another or for the run's "
    "other tests. They show how the figure grew, not a claim: the table's figures are the "
    "claims."
)


def _images(
    runs: Sequence[RunData], rows: Sequence[ReportRow], curves: Any, colors: dict[str, str]
) -> list[Any]:
    conf = runs[0].plan.confidence
    images = [
        (
            "ε emp against ε theory and ε exact",
            f"Markers: the audit's lower bounds at {conf:.0%} confidence (circles black-box, "
            "squares white-box). Dashed: the claimed ε; grey: the exact ε of the mechanism "
            "the server reports.",
            plot_epsilons(runs, rows, colors),
        ),
        (
            "Empirical trade-off points against the Gaussian μ curve",
            "Each point is (FPR upper bound, FNR upper bound) of an attack; the grey curve is "
            "f(x) = Φ(Φ⁻¹(1−x) − μ) for the mechanism's exact μ = Δ/σ. A sound server keeps "
            "every filled point above the grey curve (up to confidence); a point below the "
            "dashed line proves the (ε, δ) claim false.",
            plot_tradeoff(runs, colors),
        ),
    ]
    if any(not rd.simulated for rd in runs):
        images.append(
            (
                "ε emp against the number of real trials",
                "The estimator recomputed on the first n logged trials (real queries). "
                + _CURVE_POINTS,
                plot_trials(runs, curves, simulated=False, colors=colors),
            )
        )
    if any(rd.simulated for rd in runs):
        images.append(
            (
                "ε emp against the number of simulated trials (bootstrap)",
                "The bootstrap estimator with n simulated trials from the same clean rows; "
                "no query was sent for these trials. " + _CURVE_POINTS,
                plot_trials(runs, curves, simulated=True, colors=colors),
            )
        )

    if has_rdp(runs):  # paper 003's two pictures
        images.append(
            (
                "Privacy leakage per adversary (Renyi-DP audit, paper 003)",
                "Composed RDP over the query sequence converted to ε with Theorem 1 of 003 "
                "(an upper-bound map: for the audit bars an illustration, not a lower bound). "
                "Black ticks: the Gaussian theory at the reported σ.",
                plot_rdp_bars(runs),
            )
        )
        images.append(
            (
                "RDP against the order",
                "Composed RDP lower bounds (2-cut, k-cut) from the released labels, the exact "
                "divergence of the clean histograms and the Gaussian theory.",
                plot_rdp_curves(runs),
            )
        )
    return images


_OVERALL_STYLE = {
    "violation": "bold red",
    "bug": "bold yellow",
    "nonconforming": "bold yellow",
    "ok": "bold green",
    "inconclusive": "bold",
}


def print_findings(
    console: Console, runs: Sequence[RunData], rows: Sequence[ReportRow], why_inconclusive: str
) -> None:
    """Every finding once, under the table: each row's that is not ok (named by its run's
    key in the table), the noise checks that flag a setting, the audits from outside that
    flag a run."""
    keys = run_keys(rows)
    if why_inconclusive and any(r.status == "inconclusive" for r in rows):
        console.print(f"INCONCLUSIVE rows: {why_inconclusive}", highlight=False)
    for r in rows:
        if r.status in ("violation", "bug"):
            console.print(f"[bold red]{keys[r.run_id]} {verdict_sentence(r)}[/bold red]")
        elif r.status in ("nonconforming", "inconclusive", "error"):
            where = f"{keys[r.run_id]} {eps_label(r.setting)} {r.threat}"
            console.print(f"{where}: {r.message}", highlight=False)
    for text in noise_findings(rows):
        console.print(f"[bold red]* {text}[/bold red]")
    for rd in runs:  # the audits from outside that flag the run (probes.registry.PROBES)
        for probe, section, adds in rd.results.probes():
            if adds is not None:
                key = keys.get(rd.run_id, rd.label)
                console.print(f"[bold red]{key} {probe}: {section.get('message')}[/bold red]")


def write_combined_report(
    run_ids: Sequence[str],
    db_url: str | None,
    out_dir: str | Path,
    *,
    name: str | None = None,
    title: str | None = None,
    notes: Sequence[str] = (),
    console: Console | None = None,
    why_inconclusive: str = "",
    strict: bool = False,
) -> Path:
    """One report over several runs, side by side; returns the HTML file's path.
    ``why_inconclusive``: a line for each INCONCLUSIVE run, on its card and after the table.
    ``strict``: the exit status the overall verdict names is ``--strict``'s.

    Writes ``<out_dir>/<name>/report.html`` and ``report.json`` (the table rows, every run's
    results and the verdicts; a single run's ``results.json`` beside it keeps the runner's
    format) and prints the table. ``name``
    defaults to the run id for one run and ``report-<first run id>`` for several.
    """
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        raise InvalidAuditInput("a report needs at least one run id")
    out_directory(out_dir)  # before any work: an --out that is a file fails at once
    store = TrialStore(db_url)
    try:
        utility = utility_results(store, ids)
        runs = load_runs(store, [i for i in ids if i not in utility])
    finally:
        store.dispose()
    rows = report_rows(runs)
    title = title or (
        f"dpicl audit report: {ids[0]}" if len(ids) == 1 else f"dpicl audit report: {len(ids)} runs"
    )
    overall = overall_verdict([rd.results for rd in runs], strict=strict)
    # One line first: the overall verdict and the exit status it gives (issue 45).
    console = console or Console()
    if runs:
        style = _OVERALL_STYLE.get(overall.status.value if overall.status else "", "bold")
        console.print(Text(overall.line, style=style))
        # The terminal's own width: one wide table, or a legend and a table of 80 columns.
        print_report_table(console, rows, title)
    for u in utility.values():
        print_utility(u, console)
    print_findings(console, runs, rows, why_inconclusive)

    curves = {rd.run_id: trials_curve(rd) for rd in runs}
    dir_name = name or (ids[0] if len(ids) == 1 else f"report-{ids[0]}")
    out = out_directory(Path(out_dir) / dir_name)
    payload = _payload(title, runs, rows, notes)
    payload["overall"] = overall.to_json()
    payload["trials_curves"] = curves
    if utility:
        payload["utility"] = utility
    text = json.dumps(jsonable(payload), indent=2) + "\n"
    _write_text(out / "report.json", text)
    if len(runs) == 1 and dir_name == runs[0].run_id:
        write_results(runs[0].results.to_json(), out_dir)  # the runner's results.json, refreshed
    else:
        stale = out / "results.json"  # the old byte-identical copy of report.json
        if stale.is_file():
            stale.unlink()
    colors = run_colors(runs)
    path = out / "report.html"
    images = _images(runs, rows, curves, colors) if runs else []
    card = utility_card(list(utility.values()), rows, runs)
    page = render_html(
        title, runs, rows, images, notes, colors, card, why_inconclusive, overall=overall
    )
    _write_text(path, page)
    return path


def write_report(
    run_id: str | Sequence[str],
    db_url: str | None,
    out_dir: str | Path,
    *,
    name: str | None = None,
    title: str | None = None,
    notes: Sequence[str] = (),
    console: Console | None = None,
    strict: bool = False,
) -> Path:
    """The report of one run (``dpicl-audit report RUN``) or of several side by side.

    Returns ``<out_dir>/<run_id>/report.html``; ``results.json`` lies beside it.
    """
    ids = [run_id] if isinstance(run_id, str) else list(run_id)
    return write_combined_report(
        ids, db_url, out_dir, name=name, title=title, notes=notes, console=console, strict=strict
    )
