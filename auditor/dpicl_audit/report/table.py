"""The report's table on a terminal (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from dpicl_audit.report.data import ReportRow
from dpicl_audit.report.words import VERDICT_WORDS, eps_label, fmt

__all__ = ["WIDE", "print_report_table", "report_renderable", "rich_table"]

#: The terminal width from which the report is one table of 14 columns; narrower terminals
#: get one block per row (issue 39: forced to 160 columns, an 80-column terminal wrapped each
#: row into 7 lines).
WIDE = 150

_CAPTION = (
    "ε emp (GDP): epsilon of the mu lower bound at the stated confidence; it assumes a "
    "Gaussian trade-off (fair against the Gaussian claims of voting and ESA). "
    "ε classical: the assumption-free (ε, δ) lower bound from the same trials, its own "
    "threshold. White-box: the better of the black-box rule and a held-out threshold. "
    "Bootstrap: trials are simulated from n_llm clean "
    "vote vectors per world; its LLM calls and wall time (*) are the whole run's, "
    "shared by every ε."
)

_LEFT = ("engine", "mechanism · attack · design", "method", "ε", "threat", "verdict")


def rich_table(rows: Sequence[ReportRow], title: str) -> Table:
    table = Table(
        title=title,
        caption=_CAPTION,
    )
    for col in (
        "engine",
        "mechanism · attack · design",
        "method",
        "ε",
        "threat",
        "ε theory",
        "ε exact",
        "ε exact (shift)",
        "ε emp GDP (conf)",
        "ε classical",
        "trials",
        "LLM calls",
        "wall s",
        "verdict",
    ):
        right = col not in _LEFT
        table.add_column(col, justify="right" if right else "left")
    for r in rows:
        verdict = _verdict(r)
        trials = _trials(r)
        wall = fmt(r.wall_time_s, 1) + ("*" if r.wall_time_shared else "")
        table.add_row(
            r.engine,
            f"{r.mechanism} · {r.attack} · {r.design}",
            r.method,
            eps_label(r.setting),
            r.threat,
            fmt(r.epsilon_theory, 2),
            fmt(r.epsilon_exact),
            fmt(r.epsilon_exact_shift),
            f"{fmt(r.epsilon_emp)} ({r.confidence:.0%})",
            fmt(r.epsilon_classic),
            trials,
            "-" if r.llm_calls is None else f"{r.llm_calls:,}",
            wall,
            verdict,
        )
    return table


def _verdict(r: ReportRow) -> Text:
    style = {"violation": "bold red", "bug": "bold yellow", "ok": "green"}.get(r.status, "")
    verdict = VERDICT_WORDS.get(r.status, r.status)
    if r.noise_check and r.noise_check.get("status") == "smaller":
        verdict += " · noise<claim"
    return Text(verdict, style=style)


def _trials(r: ReportRow) -> str:
    trials = "-" if r.trials is None else f"{r.trials:,}"
    if r.method == "bootstrap" and r.n_llm is not None:
        trials += f" sim (n_llm={r.n_llm})"
    return trials


def _block(i: int, r: ReportRow) -> RenderableType:
    """One row as a few short lines (each under 60 characters but for long names, which
    wrap at spaces): the narrow terminal's layout."""
    head = Text(f"{i}. {r.engine} · {r.mechanism} · {r.attack}", style="bold")
    head.append("  ")
    head.append_text(_verdict(r))
    wall = fmt(r.wall_time_s, 1) + ("*" if r.wall_time_shared else "")
    lines = [
        head,
        Text(f"   {r.design}" if r.design else "   -"),
        Text(f"   {r.method} · {eps_label(r.setting)} · {r.threat}"),
        Text(
            f"   ε theory {fmt(r.epsilon_theory, 2)} · exact {fmt(r.epsilon_exact)}"
            f" · exact (shift) {fmt(r.epsilon_exact_shift)}"
        ),
        Text(
            f"   ε emp GDP {fmt(r.epsilon_emp)} ({r.confidence:.0%})"
            f" · classical {fmt(r.epsilon_classic)}"
        ),
        Text(
            f"   trials {_trials(r)} · LLM calls "
            f"{'-' if r.llm_calls is None else f'{r.llm_calls:,}'} · wall s {wall}"
        ),
    ]
    return Group(*lines)


def report_renderable(rows: Sequence[ReportRow], title: str, width: int) -> RenderableType:
    """The report's table for a terminal ``width`` columns wide: one table from
    :data:`WIDE` columns on, one block per row below."""
    if width >= WIDE:
        return rich_table(rows, title)
    parts: list[RenderableType] = [Rule(title, characters="─")]
    for i, r in enumerate(rows, 1):
        parts.append(_block(i, r))
        parts.append(Text(""))
    parts.append(Text(_CAPTION, style="dim"))
    return Group(*parts)


def print_report_table(console: Console, rows: Sequence[ReportRow], title: str) -> None:
    console.print(report_renderable(rows, title, console.width))
