"""The report's table on a terminal (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from dpicl_audit.report.data import ReportRow
from dpicl_audit.report.words import VERDICT_WORDS, eps_label, fmt

__all__ = ["rich_table"]

_LEFT = ("engine", "mechanism · attack · design", "method", "ε", "threat", "verdict")


def rich_table(rows: Sequence[ReportRow], title: str) -> Table:
    table = Table(
        title=title,
        caption=(
            "ε emp (GDP): epsilon of the mu lower bound at the stated confidence; it assumes a "
            "Gaussian trade-off (fair against the Gaussian claims of voting and ESA). "
            "ε classical: the assumption-free (ε, δ) lower bound from the same trials, its own "
            "threshold. White-box: the better of the black-box rule and a held-out threshold. "
            "Bootstrap: trials are simulated from n_llm clean "
            "vote vectors per world; its LLM calls and wall time (*) are the whole run's, "
            "shared by every ε."
        ),
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
        style = {"violation": "bold red", "bug": "bold yellow", "ok": "green"}.get(r.status, "")
        verdict = VERDICT_WORDS.get(r.status, r.status)
        if r.noise_check and r.noise_check.get("status") == "smaller":
            verdict += " · noise<claim"
        trials = "-" if r.trials is None else f"{r.trials:,}"
        if r.method == "bootstrap" and r.n_llm is not None:
            trials += f" sim (n_llm={r.n_llm})"
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
            Text(verdict, style=style),
        )
    return table
