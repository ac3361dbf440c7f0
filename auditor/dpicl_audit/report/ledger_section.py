"""The report's "ledger" and "conformance" sections: what the ledger's audit from outside
found (:mod:`dpicl_audit.ledger`) and each setting's conformance tests
(:mod:`dpicl_audit.estimators.conformance`). One self-contained function each, so that the
report's layout can place them where it likes."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from dpicl_audit.report.data import RunData

__all__ = ["conformance_html", "ledger_html"]


def _e(text: Any) -> str:
    return html.escape(str(text))


def ledger_html(runs: Sequence[RunData]) -> str:
    """``<h2>Ledger</h2>`` and one block per run that audited its server's ledger."""
    blocks = []
    for rd in runs:
        led = rd.ledger
        if not led:
            continue
        rows = "".join(
            f"<tr><td>{_e(c.get('check'))}</td><td>{'ok' if c.get('ok') else 'FAILED'}</td>"
            f"<td>{_e(c.get('reported'))}</td><td>{_e(c.get('expected'))}</td></tr>"
            for c in led.get("checks") or []
        )
        budget = led.get("budget") or {}
        blocks.append(
            f"<div class='finding {_e(led.get('status'))}'><b>{_e(rd.label)}</b>: "
            f"{_e(led.get('message', ''))} (probe budget epsilon "
            f"{_e(round(float(budget.get('epsilon', 0.0)), 4))} at delta "
            f"{_e(budget.get('delta'))})</div>"
            + (
                "<table><tr><th>check</th><th>result</th><th>reported</th><th>expected</th>"
                f"</tr>{rows}</table>"
                if rows
                else ""
            )
        )
    return "<h2>Ledger</h2>" + "".join(blocks) if blocks else ""


def conformance_html(runs: Sequence[RunData]) -> str:
    """``<h2>Conformance</h2>``: each setting's tests against the design's prediction."""
    rows = []
    for rd in runs:
        for s in rd.results.get("settings") or []:
            conf = s.get("conformance")
            if not conf:
                continue
            rows.append(
                f"<tr><td>{_e(rd.label)}</td><td>{_e(s.get('setting'))}</td>"
                f"<td>{_e(conf.get('status'))}</td><td>{_e(', '.join(conf.get('differs') or []))}"
                f"</td><td>{_e(conf.get('message'))}</td></tr>"
            )
    if not rows:
        return ""
    return (
        "<h2>Conformance</h2><p class=small>The server's releases tested against the "
        "distribution the design predicts (release rates; the noise's scale, correlation, "
        "tails, independence and determinism where the debug endpoint shows it).</p>"
        "<table><tr><th>run</th><th>setting</th><th>status</th><th>differs</th><th>tests</th>"
        f"</tr>{''.join(rows)}</table>"
    )
