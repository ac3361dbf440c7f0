"""The privacy-utility card: per setting, what the audit measured (``run``: epsilon emp beside
epsilon exact and theory) next to what the deployment keeps (``utility``: accuracy or ROUGE-L
with its interval, the baselines and the ledger's spend), when a report is given both kinds
of run (``dpicl-audit report AUDIT_RUN UTILITY_RUN``).

A utility cell (epsilon, T) is matched with the audit rows at the same epsilon; the audit's
T is shown beside it, since a run audits one T and the utility grid may hold several (the
noise, and so epsilon exact, does not depend on T for voting's sensitivity sqrt 2).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpicl_audit.report.data import ReportRow, RunData
from dpicl_audit.report.words import fmt
from dpicl_audit.utility.results import IntervalJson, UtilityResults, metric_of

__all__ = ["CARD_CSS", "utility_card"]

CARD_CSS = """
.pu{margin:.6em 0}.pu td,.pu th{vertical-align:middle}
.acc{position:relative;height:1em;background:#f1f1f1;border-radius:2px;min-width:8em}
.acc .ci{position:absolute;top:.15em;bottom:.15em;background:#7aa6d8;border-radius:2px}
.acc .pt{position:absolute;top:-.1em;bottom:-.1em;width:3px;background:#123}
.acc .zs{position:absolute;top:-.25em;bottom:-.25em;width:0;border-left:2px dotted #b00}
.acc .fs{position:absolute;top:-.25em;bottom:-.25em;width:0;border-left:2px dashed #070}
.acc .mj{position:absolute;top:-.25em;bottom:-.25em;width:0;border-left:3px solid #888}
"""

_BASELINES = ("majority", "zero-shot", "few-shot")


def _e(text: Any) -> str:
    return html.escape(str(text))


def _pct(v: float) -> str:
    return f"{min(max(v, 0.0), 1.0) * 100:.1f}%"


def _bar(value: IntervalJson | None, marks: Mapping[str, float]) -> str:
    """The interval as a band on [0, 1], the estimate as a tick, the baselines as lines."""
    inner = ""
    if value:
        lo, hi = float(value["low"]), float(value["high"])
        inner += f"<div class=ci style='left:{_pct(lo)};width:{_pct(hi - lo)}'></div>"
        inner += f"<div class=pt style='left:{_pct(float(value['value']))}'></div>"
    for cls, v in marks.items():
        inner += f"<div class={cls} style='left:{_pct(v)}'></div>"
    return f"<div class=acc>{inner}</div>"


def _interval(value: IntervalJson | None) -> str:
    if not value:
        return "-"
    return f"{value['value']:.3f} [{value['low']:.3f}, {value['high']:.3f}]"


def _audit_at(
    epsilon: float, rows: Sequence[ReportRow], runs: Sequence[RunData]
) -> tuple[str, str, str, str]:
    """(epsilon theory, exact, the largest emp with its threat model, the audits' T)."""
    same = [
        r
        for r in rows
        if r.epsilon_theory is not None and math.isclose(r.epsilon_theory, epsilon, rel_tol=1e-9)
    ]
    if not same:
        return fmt(epsilon, 2), "-", "not audited", "-"
    exact = next((r.epsilon_exact for r in same if r.epsilon_exact is not None), None)
    emps = [r for r in same if r.epsilon_emp is not None]
    best = max(emps, key=lambda r: float(r.epsilon_emp or 0.0)) if emps else None
    emp = f"{fmt(best.epsilon_emp, 2)} ({best.threat})" if best else "-"
    # T where the audited mechanism has partitions (a partitioned mechanism's settings)
    ts = sorted(
        t
        for t in {
            getattr(rd.plan.mechanism, "partitions", None)
            for rd in runs
            if rd.run_id in {r.run_id for r in same}
        }
        if isinstance(t, int)
    )
    return fmt(epsilon, 2), fmt(exact, 2), emp, ", ".join(str(t) for t in ts) or "-"


def _one(results: UtilityResults, rows: Sequence[ReportRow], runs: Sequence[RunData]) -> str:
    metric = str(results.get("metric", "accuracy"))
    cells = list(results.get("cells") or [])
    by_name = {c["setting"]: c for c in cells}
    baselines = {
        cls: metric_of(by_name[name], metric) if name in by_name else None
        for cls, name in (("mj", "majority"), ("zs", "zero-shot"), ("fs", "few-shot"))
    }
    marks = {cls: float(v["value"]) for cls, v in baselines.items() if v}
    # The two figures the card is for come first, so that a phone shows them before its
    # table scrolls sideways.
    head = (
        f"<tr><th class=l>setting</th><th class=l>{_e(metric.replace('_', '-'))} [95% CI]</th>"
        "<th>ε emp (audit)</th><th>ε exact</th><th>ε theory</th>"
        "<th class=l style='width:30%'>on [0, 1]</th><th>audit T</th>"
        "<th>ε spent (ledger)</th></tr>"
    )
    body = []
    for c in cells:
        value = metric_of(c, metric)
        spent = c.get("spent_epsilon")
        if c["setting"] in _BASELINES:
            # How it was measured: the route and server (the sentence in full on hover), short
            # enough that a phone's row stays one or two lines.
            how = str(c.get("measured_by") or "")
            what = _e(c["refused"]) if "refused" in c else _e(how.split(":")[0])
            shown = "not offered" if "refused" in c else _interval(value)
            if not c.get("queries") and "refused" not in c:
                shown = "not measured"
            body.append(
                f"<tr><td class='l nw'>{_e(c['setting'])}</td><td class='l nw'>{shown}</td>"
                f"<td colspan=3 class='l small' title='{_e(how)}'>"
                f"{what or 'baseline (no privacy)'}</td>"
                f"<td>{_bar(value, marks)}</td><td>-</td><td>{fmt(spent, 2)}</td></tr>"
            )
            continue
        eps = float(c["epsilon"] or 0.0)  # a private cell's, always set (utility.report)
        theory, exact, emp, audit_t = _audit_at(eps, rows, runs)
        body.append(
            f"<tr><td class='l nw'>ε={eps:g}, T={c['partitions']}</td>"
            f"<td class='l nw'>{_interval(value)}</td><td class=nw>{_e(emp)}</td>"
            f"<td>{exact}</td><td>{theory}</td><td>{_bar(value, marks)}</td>"
            f"<td>{_e(audit_t)}</td><td>{fmt(spent, 2)}</td></tr>"
        )
    title = (
        f"{_e(results.get('run_id', ''))}: {_e(results.get('mechanism', ''))} on "
        f"{_e(results.get('dataset', ''))}"
    )
    per = results.get("spent_epsilon_per_exemplar")
    foot = (
        f"<p class=small>The evaluation's exemplars paid at most ε {fmt(per, 2)} each over the "
        "private cells (the server's ledger, composed over the cells).</p>"
        if per is not None
        else ""
    )
    degenerate = results.get("degenerate")
    lead = f"<div class='finding violation'>{_e(degenerate)}</div>" if degenerate else ""
    found = "".join(
        f"<div class='finding inconclusive'>{_e(f.get('message'))}</div>"
        for f in results.get("findings") or []
    )
    return (
        f"<h3>{title}</h3>{lead}<div class=scroll><table class=pu>{head}{''.join(body)}"
        f"</table></div>{found}" + foot
    )


def utility_card(
    utility: Sequence[UtilityResults], rows: Sequence[ReportRow], runs: Sequence[RunData]
) -> str:
    """The card's HTML section (empty without utility runs)."""
    if not utility:
        return ""
    parts = "".join(_one(u, rows, runs) for u in utility)
    return (
        "<h2>Privacy and utility</h2><p class=small>Per setting: the audit's ε emp (its "
        "largest lower bound at that ε) beside ε exact and ε theory, and the utility the "
        "deployment keeps there with its 95% interval (band; tick: the estimate). Baselines "
        "on the bar: dashed green the non-private few-shot answer, dotted red zero-shot, "
        "solid grey the majority-class rate (always the most common label). A cell that "
        "answers one label to nearly every query, or whose accuracy a one-sided exact "
        "binomial test cannot tell from the majority rate, is listed under its table.</p>" + parts
    )
