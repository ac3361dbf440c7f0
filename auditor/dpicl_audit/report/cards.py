"""The report's first screen: one card per run (its name, its verdict, and per epsilon a
bar of epsilon_emp against ticks at epsilon_exact and epsilon_theory), in the run's colour."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpicl_audit.report.data import ReportRow, RunData
from dpicl_audit.report.words import VERDICT_WORDS, eps_label, fmt, run_verdict

__all__ = ["VERDICT_SENTENCES", "cards", "run_style"]

VERDICT_SENTENCES = {
    "violation": "the privacy claim is violated",
    "bug": "ε emp above ε exact, or a reported calibration weaker than claimed: a bug",
    "nonconforming": "the server does not release what the mechanism it reports would",
    "inconclusive": "could not have seen a violation at some ε",
    "ok": "consistent with the claim, with the power to see a violation",
}


def _e(text: Any) -> str:
    return html.escape(str(text))


def run_style(colors: Mapping[str, str], run_id: str) -> str:
    return f" style='--run:{_e(colors.get(run_id, '#888'))}'"


def _bars(rows: Sequence[ReportRow]) -> str:
    """Per epsilon: a bar of the run's largest ε emp, a black tick at ε exact and a dashed
    red tick at ε theory, all on one scale (the largest of the three, plus a margin)."""
    by_eps: dict[str, list[ReportRow]] = {}
    for r in rows:
        by_eps.setdefault(r.setting, []).append(r)
    out = []
    for setting, rs in by_eps.items():
        theory = next((r.epsilon_theory for r in rs if r.epsilon_theory is not None), None)
        exact = next((r.epsilon_exact for r in rs if r.epsilon_exact is not None), None)
        emps = [r.epsilon_emp for r in rs if r.epsilon_emp is not None]
        emp = max(emps) if emps else None
        finite = [v for v in (theory, exact, emp) if v is not None and math.isfinite(v)]
        scale = max(finite) * 1.1 if finite and max(finite) > 0 else 1.0

        def pos(v: float | None, scale: float = scale) -> float:
            return 0.0 if v is None or not math.isfinite(v) else min(v / scale, 1.0) * 100

        marks = f"<div class=emp style='width:{pos(emp):.1f}%'></div>"
        if exact is not None:
            marks += f"<div class=exact style='left:{pos(exact):.1f}%'></div>"
        if theory is not None:
            marks += f"<div class=theory style='left:{pos(theory):.1f}%'></div>"
        title = f"ε emp {fmt(emp)} · ε exact {fmt(exact)} · ε theory {fmt(theory, 2)}"
        out.append(
            f"<tr title='{_e(title)}'><td class='l nw'>{_e(eps_label(setting))}</td>"
            f"<td style='width:100%'><div class=track>{marks}</div></td>"
            f"<td class=nw>{fmt(emp, 2)} / {fmt(exact, 2)} / {fmt(theory, 2)}</td></tr>"
        )
    return f"<table class=bars>{''.join(out)}</table>"


def cards(
    runs: Sequence[RunData],
    rows: Sequence[ReportRow],
    colors: Mapping[str, str],
    why_inconclusive: str = "",
) -> str:
    """One card per run; ``why_inconclusive`` is a line an INCONCLUSIVE card adds (the demo:
    why that is expected there, so that a newcomer does not read it as a failure)."""
    cards = []
    for rd in runs:
        mine = [r for r in rows if r.run_id == rd.run_id]
        status = run_verdict(mine, rd.probe_statuses) if mine or rd.probe_statuses else "error"
        badge = VERDICT_WORDS.get(status, status)
        models = rd.results.threat_models or [rd.plan.threat_model]
        what = (
            f"{rd.engine} · {rd.mechanism} · "
            f"{'bootstrap' if rd.simulated else 'real trials'} · "
            f"{', '.join(models)}"
        )
        cards.append(
            f"<div class=card{run_style(colors, rd.run_id)}>"
            f"<div class=name>{_e(rd.label)}</div>"
            f"<span class='badge {_e(status)}'>{_e(badge)}</span> "
            f"<span class=small>{_e(VERDICT_SENTENCES.get(status, 'no estimate'))}</span>"
            + (
                f"<div class=small><i>{_e(why_inconclusive)}</i></div>"
                if status == "inconclusive" and why_inconclusive
                else ""
            )
            + f"<div class=small>{_e(what)}</div>{_bars(mine)}</div>"
        )
    return f"<div class=cards>{''.join(cards)}</div>"
