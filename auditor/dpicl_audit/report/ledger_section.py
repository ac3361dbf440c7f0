"""The report's "ledger", "conformance" and "ROC" sections: what the ledger's audit from
outside found (:mod:`dpicl_audit.probes.ledger`), each setting's conformance tests
(:mod:`dpicl_audit.estimators.conformance`) and each attack's ROC figures
(:mod:`dpicl_audit.estimators.roc`). One self-contained function each, so that the report's
layout can place them where it likes."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from dpicl_audit.estimators.roc import LOW_FPRS
from dpicl_audit.report.data import RunData

__all__ = ["conformance_html", "ledger_html", "roc_html"]


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
            f"<tr><td>{_e(c.get('check'))}</td><td>{_outcome(c.get('ok'))}</td>"
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
                "<div class=scroll><table><tr><th>check</th><th>result</th><th>reported</th>"
                f"<th>expected</th></tr>{rows}</table></div>"
                if rows
                else ""
            )
        )
    return "<h2>Ledger</h2>" + "".join(blocks) if blocks else ""


def conformance_html(runs: Sequence[RunData]) -> str:
    """``<h2>Conformance</h2>``: each setting's tests against the design's prediction."""
    rows = []
    for rd in runs:
        for s in rd.results.settings:
            conf = s.conformance
            if not conf:
                continue
            rows.append(
                f"<tr><td>{_e(rd.label)}</td><td>{_e(s.setting)}</td>"
                f"<td>{_e(conf.get('status'))}</td><td>{_e(', '.join(conf.get('differs') or []))}"
                f"</td><td>{_e(conf.get('message'))}</td></tr>"
            )
    if not rows:
        return ""
    return (
        "<h2>Conformance</h2><p class=small>The server's releases tested against the "
        "distribution the design predicts (release rates; the noise's scale, correlation, "
        "tails, independence and determinism where the debug endpoint shows it).</p>"
        "<div class=scroll><table><tr><th>run</th><th>setting</th><th>status</th>"
        f"<th>differs</th><th>tests</th></tr>{''.join(rows)}</table></div>"
    )


def roc_html(runs: Sequence[RunData]) -> str:
    """``<h2>Attack ROC</h2>``: AUROC and TPR at low FPR of each figure's attack, beside the
    bounds (descriptive: no confidence interval)."""

    rows = []
    for rd in runs:
        for s in rd.results.settings:
            for key in ("black_box", "white_box"):
                est = s.estimate(key)
                roc = None if est is None else est.extra.get("roc")
                if not roc:
                    continue
                at = roc.get("tpr_at_fpr") or {}
                cells = "".join(f"<td>{float(at.get(f'{x:g}', 0.0)):.3f}</td>" for x in LOW_FPRS)
                rows.append(
                    f"<tr><td>{_e(rd.label)}</td><td>{_e(s.setting)}</td>"
                    f"<td>{_e(key.replace('_', '-'))}</td><td>{float(roc['auroc']):.3f}</td>"
                    f"{cells}</tr>"
                )
    if not rows:
        return ""
    heads = "".join(f"<th>TPR at FPR {x:g}</th>" for x in LOW_FPRS)
    return (
        "<h2>Attack ROC</h2><p class=small>The attack's ROC on the logged trials, as "
        "membership-inference tools report it: descriptive figures beside the bounds above, "
        "which are the audit's claims.</p><div class=scroll><table><tr><th>run</th><th>setting"
        f"</th><th>threat</th><th>AUROC</th>{heads}</tr>{''.join(rows)}</table></div>"
    )


def _outcome(ok: object) -> str:
    """A check's cell: passed, failed, or not observable on this deployment."""
    return "not observed" if ok is None else "ok" if ok else "FAILED"
