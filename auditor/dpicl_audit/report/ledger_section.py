"""The report's "ledger", "conformance" and "ROC" sections: what the ledger's audit from
outside found (:mod:`dpicl_audit.probes.ledger`), each setting's conformance tests
(:mod:`dpicl_audit.estimators.conformance`) and each attack's ROC figures
(:mod:`dpicl_audit.estimators.roc`). One self-contained function each, so that the report's
layout can place them where it likes."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dpicl_audit.estimators.roc import LOW_FPRS
from dpicl_audit.probes.sections import LedgerCheck
from dpicl_audit.report.data import RunData

__all__ = ["STACK_CSS", "conformance_html", "ledger_html", "roc_html", "stacked"]


def _e(text: Any) -> str:
    return html.escape(str(text))


#: Below 640 px a ``stacked`` table shows each row as a small block of "header: value"
#: lines, as the results table does: at 390 px the run name wrapped over 8 lines and the
#: last column was cut (issue 45).
STACK_CSS = """
@media (max-width:640px){
table.stack,table.stack tbody{display:block;border:0;width:100%}
table.stack tr.head{display:none}
table.stack tr{display:block;border:1px solid #ccc;border-radius:4px;margin:.5em 0;
padding:.2em .4em}
table.stack td{display:flex;justify-content:space-between;gap:1em;border:0;
padding:.1em .2em;max-width:none;white-space:normal;text-align:right;overflow-wrap:anywhere}
table.stack td::before{content:attr(data-label);font-weight:normal;color:#555;
text-align:left;white-space:nowrap}
table.stack td.first{display:block;font-weight:bold;text-align:left}
table.stack td.first::before{content:none}
}
"""

_TR = re.compile(r"<tr\b[^>]*>(.*?)</tr>", re.S)
_TH = re.compile(r"<th\b[^>]*>(.*?)</th>", re.S)
_TD = re.compile(r"<td\b")
_TAG = re.compile(r"<[^>]+>")


def stacked(table: str) -> str:
    """``table`` (this module's markup: a header row of ``<th>``, body rows of ``<td>``) with
    each cell labelled by its column's header, the header row marked, and the table of class
    ``stack`` (:data:`STACK_CSS`): the same table on a wide page, blocks on a phone."""
    heads: list[str] = []

    def row(m: re.Match[str]) -> str:
        inner = m.group(1)
        if not heads and "<th" in inner:
            heads.extend(html.unescape(_TAG.sub("", h)).strip() for h in _TH.findall(inner))
            return f"<tr class=head>{inner}</tr>"
        cells = iter(range(10_000))

        def label(_: re.Match[str]) -> str:
            i = next(cells)
            name = heads[i] if i < len(heads) else ""
            first = " class=first" if i == 0 else ""
            return f"<td data-label='{_e(name)}'{first}"

        return f"<tr>{_TD.sub(label, inner)}</tr>"

    out = _TR.sub(row, table)
    # A first cell with a class of its own keeps it beside "first" (one class attribute).
    out = re.sub(r"class=first class=(['\"])", r"class=\1first ", out)
    out = re.sub(r"class=first class=([\w-]+)", r"class='first \1'", out)
    return out.replace("<table>", "<table class=stack>", 1)


def ledger_html(runs: Sequence[RunData]) -> str:
    """``<h2>Ledger</h2>`` and one block per run that audited its server's ledger."""
    blocks = []
    for rd in runs:
        led = rd.ledger
        if not led:
            continue
        rows = "".join(
            f"<tr><td>{_e(c.get('check'))}</td><td>{_outcome(c.get('ok'))}</td>"
            f"<td>{_e(_value(c.get('reported')))}</td><td>{_e(_expected(c))}</td></tr>"
            for c in led.get("checks") or []
        )
        budget = led.get("budget") or {}
        blocks.append(
            f"<div class='finding {_e(led.get('status'))}'><b>{_e(rd.label)}</b>: "
            f"{_e(led.get('message', ''))} (probe budget epsilon "
            f"{_e(round(float(budget.get('epsilon', 0.0)), 4))} at delta "
            f"{_e(budget.get('delta'))})</div>"
            + (
                "<div class=scroll>"
                + stacked(
                    "<table><tr><th>check</th><th>result</th><th>reported</th>"
                    f"<th>ok when</th></tr>{rows}</table>"
                )
                + "</div>"
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
            differs = conf.get("differs")
            named = ", ".join(str(d) for d in differs) if isinstance(differs, list) else ""
            rows.append(
                f"<tr><td>{_e(rd.label)}</td><td>{_e(s.setting)}</td>"
                f"<td>{_e(conf.get('status'))}</td><td>{_e(named)}"
                f"</td><td>{_e(conf.get('message'))}</td></tr>"
            )
    if not rows:
        return ""
    return (
        "<h2>Conformance</h2><p class=small>The server's releases tested against the "
        "distribution the design predicts (release rates; the noise's scale, correlation, "
        "tails, independence and determinism where the debug endpoint shows it).</p>"
        "<div class=scroll>"
        + stacked(
            "<table><tr><th>run</th><th>setting</th><th>status</th>"
            f"<th>differs</th><th>tests</th></tr>{''.join(rows)}</table>"
        )
        + "</div>"
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
                negatives = None if est is None or est.fp is None else est.fp + (est.tn or 0)
                cells = "".join(_tail_cell(at, x, negatives) for x in LOW_FPRS)
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
        "which are the audit's claims. A TPR at FPR x needs at least 1/x trials without the "
        "canary (one false positive is then FPR x): from fewer it is not shown (-).</p>"
        "<div class=scroll>"
        + stacked(
            "<table><tr><th>run</th><th>setting"
            f"</th><th>threat</th><th>AUROC</th>{heads}</tr>{''.join(rows)}</table>"
        )
        + "</div>"
    )


def _tail_cell(at: Mapping[str, float], x: float, negatives: int | None) -> str:
    """A TPR at FPR ``x``, or "-" where fewer than 1/x trials without the canary were
    logged (issue 45: a TPR at FPR 0.001 from 14 trials)."""
    need = math.ceil(1.0 / x - 1e-9)
    if negatives is not None and negatives < need:
        return (
            f"<td title='needs at least {need:,} trials without the canary; the run had "
            f"{negatives:,}'>-</td>"
        )
    return f"<td>{float(at.get(f'{x:g}', 0.0)):.3f}</td>"


def _value(value: object) -> object:
    return "-" if value is None else value


def _expected(check: LedgerCheck) -> str:
    """What makes a check ok: the claim's check asks for at least the answers it implies
    (issue 45: ``ok | reported 3 | expected 2`` read as a mismatch), the others for
    equality."""
    want = check.get("expected")
    if want is None:
        return "-"
    if str(check.get("check", "")).startswith("the reported noise admits"):
        return f"at least {want}"
    return f"= {want}"


def _outcome(ok: object) -> str:
    """A check's cell: passed, failed, or not observable on this deployment."""
    return "not observed" if ok is None else "ok" if ok else "FAILED"
