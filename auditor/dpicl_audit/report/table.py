"""The report's table on a terminal (rich)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich import box
from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from dpicl_audit.report.data import ReportRow
from dpicl_audit.report.words import VERDICT_WORDS, eps_label, fmt

__all__ = [
    "WIDE",
    "narrow_table",
    "print_report_table",
    "report_renderable",
    "rich_table",
    "run_keys",
]

#: The terminal width from which the report is one table of 14 columns; narrower terminals
#: get a legend of the runs and a table of 9 columns that fits 80 (issue 39: forced to 160
#: columns, an 80-column terminal wrapped each row into 7 lines; issue 45: a block per row
#: made the demo's summary 250 lines).
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


def _verdict(r: ReportRow, short: bool = False) -> Text:
    style = {"violation": "bold red", "bug": "bold yellow", "ok": "green"}.get(r.status, "")
    verdict = VERDICT_WORDS.get(r.status, r.status)
    if short and r.noise_check and r.noise_check.get("status") == "smaller":
        verdict += "*"  # the noise finding is printed under the table
    elif r.noise_check and r.noise_check.get("status") == "smaller":
        verdict += " · noise<claim"
    return Text(verdict, style=style)


def _trials(r: ReportRow) -> str:
    trials = "-" if r.trials is None else f"{r.trials:,}"
    if r.method == "bootstrap" and r.n_llm is not None:
        trials += f" sim (n_llm={r.n_llm})"
    return trials


def run_keys(rows: Sequence[ReportRow]) -> dict[str, str]:
    """A short key per run (A, B, ..., Z, AA, ...), in the rows' order: the narrow table
    names a run by it, and the legend above the table says which run it is."""
    keys: dict[str, str] = {}
    for r in rows:
        if r.run_id not in keys:
            n, key = len(keys), ""
            while True:
                key = chr(ord("A") + n % 26) + key
                n = n // 26 - 1
                if n < 0:
                    break
            keys[r.run_id] = key
    return keys


def _legend(keyed: Mapping[str, Sequence[ReportRow]]) -> Table:
    """The runs above the narrow table, one per key: what each audited, its method and its
    LLM calls (its lines wrap beside the key)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True, justify="right")
    grid.add_column(ratio=1)
    for key, rows in keyed.items():
        r = rows[0]
        calls = {x.setting: x.llm_calls for x in rows if x.llm_calls is not None}
        cost = f" · {sum(calls.values()):,} LLM calls" if calls else ""
        if r.method == "bootstrap" and r.n_llm is not None:
            cost += f" (n_llm={r.n_llm})"
        design = f" · {r.design}" if r.design else ""
        grid.add_row(
            key,
            Text(f"{r.run_id}: {r.engine} · {r.mechanism} · {r.attack}{design} · {r.method}{cost}"),
        )
    return grid


def narrow_table(rows: Sequence[ReportRow]) -> Table:
    """The report's table in under 80 columns: one line per row, the run named by its key
    (:func:`run_keys`, the legend above it), the figures in the columns that fit."""
    keys = run_keys(rows)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("run", "ε", "threat", "theory", "exact", "ε emp", "classic", "trials", "verdict"):
        justify = "left" if col in ("run", "threat", "verdict") else "right"
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in rows:
        trials = "-" if r.trials is None else f"{r.trials:,}"
        if r.method == "bootstrap":
            trials += " sim"
        table.add_row(
            keys[r.run_id],
            eps_label(r.setting).removeprefix("ε="),
            r.threat.removesuffix("-box"),
            fmt(r.epsilon_theory, 2),
            fmt(r.epsilon_exact, 2),
            fmt(r.epsilon_emp, 2),
            fmt(r.epsilon_classic, 2),
            trials,
            _verdict(r, short=True),
        )
    return table


_NARROW_CAPTION = (
    "theory: ε as configured; exact: the mechanism's true ε; ε emp: the GDP lower bound "
    "(assumes a Gaussian trade-off); classic: the assumption-free bound; both at the run's "
    "confidence (95% unless said). white-box: the better of the black-box rule and a "
    "held-out threshold. sim: bootstrap trials, simulated from n_llm clean rows."
)


def report_renderable(rows: Sequence[ReportRow], title: str, width: int) -> RenderableType:
    """The report's table for a terminal ``width`` columns wide: one table of every column
    from :data:`WIDE` columns on; below, a legend of the runs and a table of the figures
    that fits 80 columns (issue 45: the block per row made the demo's summary 250 lines)."""
    if width >= WIDE:
        return rich_table(rows, title)
    keys = run_keys(rows)
    by_run: dict[str, list[ReportRow]] = {}
    for r in rows:
        by_run.setdefault(keys[r.run_id], []).append(r)
    parts: list[RenderableType] = [Rule(title, characters="─"), _legend(by_run)]
    parts += [Text(""), narrow_table(rows), Text(_NARROW_CAPTION, style="dim")]
    return Group(*parts)


def print_report_table(console: Console, rows: Sequence[ReportRow], title: str) -> None:
    console.print(report_renderable(rows, title, console.width))
