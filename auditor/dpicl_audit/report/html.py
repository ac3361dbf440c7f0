"""The self-contained HTML report: verdicts, findings, the results table, the noise check,
the plots (embedded PNGs) and each run's details, with nothing loaded from elsewhere.

The page fits a narrow window: the results table scrolls inside its own box, long values
wrap, and images scale to the page width (a browser test checks 800 and 1400 px).
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping, Sequence
from typing import Any

from dpicl_audit.report.data import ReportRow, RunData, num
from dpicl_audit.report.ledger_section import conformance_html, ledger_html, roc_html
from dpicl_audit.report.words import (
    VERDICT_WORDS,
    eps_label,
    fmt,
    noise_findings,
    run_verdict,
    verdict_sentence,
)

__all__ = ["render_html"]

_CSS = """
*{box-sizing:border-box}
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1180px;
color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.6em;overflow-wrap:anywhere}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
h3{overflow-wrap:anywhere}
.scroll{max-width:100%;overflow-x:auto;margin:.6em 0}
table{border-collapse:collapse;font-size:.86em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
td.wrap{overflow-wrap:anywhere;max-width:60ch}
table.kv{max-width:100%}table.kv td{overflow-wrap:anywhere}
.violation{background:#fde0e0;color:#900;font-weight:bold}
.bug{background:#fff3cd;color:#7a5b00;font-weight:bold}
.ok{color:#17652a}.error{color:#777}
.finding{padding:.45em .8em;margin:.3em 0;border-left:5px solid #999;background:#fafafa;
overflow-wrap:anywhere}
.finding.violation{border-color:#c00}.finding.bug{border-color:#d9a400}.finding.ok{border-color:#2a8a3e}.finding.inconclusive{border-color:#888}
img{max-width:100%;height:auto;border:1px solid #eee}code{background:#f4f4f4;padding:0 .25em}
.small{font-size:.85em;color:#555}
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _results_table(rows: Sequence[ReportRow]) -> str:
    head = (
        "<tr><th class=l>engine</th><th class=l>mechanism · attack · design</th>"
        "<th class=l>method</th><th class=l>ε</th>"
        "<th class=l>threat</th><th>ε theory</th><th>ε exact</th>"
        "<th title='ESA: exact ε for the canary&#39;s actual embedding shift'>ε exact (shift)</th>"
        "<th title='GDP figure: epsilon of mu_lower, assumes a Gaussian trade-off'>"
        "ε emp (GDP)</th><th title='assumption-free (epsilon, delta) bound, its own threshold'>"
        "ε classical</th><th>confidence</th><th>μ lower</th><th>trials</th><th>LLM calls</th>"
        "<th>wall s</th>"
        "<th class=l>verdict</th></tr>"
    )
    body = []
    for r in rows:
        verdict = VERDICT_WORDS.get(r.status, r.status)
        if r.noise_check and r.noise_check.get("status") == "smaller":
            verdict += " · noise smaller than claimed"
        trials = "-" if r.trials is None else f"{r.trials:,}"
        if r.method == "bootstrap" and r.n_llm is not None:
            trials += f" simulated<br><span class=small>n_llm={r.n_llm} per world</span>"
        body.append(
            f"<tr><td class=l>{_e(r.engine)}</td>"
            f"<td class='l wrap'>{_e(r.mechanism)} · {_e(r.attack)}<br>"
            f"<span class=small>{_e(r.design)}</span></td><td class=l>{_e(r.method)}</td>"
            f"<td class=l>{_e(eps_label(r.setting))}</td><td class=l>{_e(r.threat)}</td>"
            f"<td>{fmt(r.epsilon_theory, 2)}</td><td>{fmt(r.epsilon_exact)}</td>"
            f"<td>{fmt(r.epsilon_exact_shift)}</td>"
            f"<td><b>{fmt(r.epsilon_emp)}</b></td><td>{fmt(r.epsilon_classic)}</td>"
            f"<td>{r.confidence:.0%}</td>"
            f"<td>{fmt(r.mu_lower)}</td><td>{trials}</td>"
            f"<td>{'-' if r.llm_calls is None else f'{r.llm_calls:,}'}</td>"
            f"<td>{fmt(r.wall_time_s, 1)}{'*' if r.wall_time_shared else ''}</td>"
            f"<td class='l wrap {_e(r.status)}' title='{_e(r.message)}'>{_e(verdict)}</td></tr>"
        )
    return f"<div class=scroll><table>{head}{''.join(body)}</table></div>"


def _esa_status(nc: Mapping[str, Any]) -> str:
    if nc.get("consistent") is None:
        return "unchecked"
    if nc["consistent"]:
        return "consistent"
    hi, reported = num((nc.get("sigma_interval") or [0, 0])[1]), num(nc.get("sigma_reported"))
    return "smaller" if hi is not None and reported is not None and hi < reported else "larger"


def _noise_table(runs: Sequence[RunData]) -> str:
    """The bootstrap's noise check per (run, epsilon): reported vs measured sigma."""
    body = []
    for rd in runs:
        for s in rd.results.get("settings", []):
            nc = s.get("noise_check")
            if not isinstance(nc, Mapping):
                continue
            # voting (noise_check.py) and ESA (chi-square on the mean) name things apart
            interval = nc.get("sigma_interval") or [nc.get("sigma_lower"), nc.get("sigma_upper")]
            lo, hi = interval[0], interval[1]
            measured = nc.get("sigma_measured", nc.get("sigma_hat"))
            reported = nc.get("sigma_reported", nc.get("claimed_sigma"))
            status = str(nc.get("status") or _esa_status(nc))
            css = {"smaller": "violation", "consistent": "ok"}.get(status, "")
            body.append(
                f"<tr><td class='l wrap'>{_e(rd.label)}</td>"
                f"<td class=l>{_e(eps_label(str(s['setting'])))}</td>"
                f"<td>{fmt(num(reported))}</td>"
                f"<td>{fmt(num(measured))}</td>"
                f"<td>[{fmt(num(lo))}, {fmt(num(hi))}]</td>"
                f"<td>{fmt(num(s.get('sigma_simulated')))}</td>"
                f"<td class='l wrap {css}'>{_e(nc.get('message') or status)}</td></tr>"
            )
    if not body:
        return ""
    head = (
        "<tr><th class=l>run</th><th class=l>ε</th><th>σ reported</th><th>σ measured</th>"
        "<th>interval</th><th>σ simulated</th><th class=l>check</th></tr>"
    )
    return (
        "<h2>Noise check</h2><p class=small>The bootstrap adds noise itself, so it first "
        "measures the noise the server really adds (noisy − clean residuals) and simulates "
        "with the conservative value when the measurement is below the claim.</p>"
        f"<div class=scroll><table>{head}{''.join(body)}</table></div>"
    )


def _kv(items: Sequence[tuple[str, Any]]) -> str:
    li = "".join(f"<tr><td class=l>{_e(k)}</td><td class=l>{v}</td></tr>" for k, v in items)
    return f"<table class=kv>{li}</table>"


def _health(server: Mapping[str, Any]) -> str:
    """The server's /healthz as a small table (nested values as compact text)."""
    if not server:
        return "-"
    rows = []
    for key in sorted(server):
        value = server[key]
        if isinstance(value, Mapping):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        rows.append((str(key), _e(value)))
    return _kv(rows)


def _run_details(rd: RunData, rows: Sequence[ReportRow]) -> str:
    p, d, res = rd.plan, rd.results.get("design") or {}, rd.results
    m = p.mechanism
    server = (res.get("versions") or {}).get("server") or {}
    if m.name == "dps-mozo":
        mech = (
            f"dps-mozo, |D|={m.exemplars}, n_shots={m.n_shots or m.exemplars}, top_k={m.top_k}, "
            f"max_tokens={m.max_tokens}, {m.queries_per_context} queries per context, "
            f"delta={m.delta:g}"
        )
    else:
        mech = (
            f"{m.name}, T={m.partitions}, {m.shots} shots/partition, temperature "
            f"{m.temperature}, delta={m.delta:g}, calibration {m.calibration}"
            + (f", T_cand={m.candidates}, max_tokens={m.max_tokens}" if m.name == "esa" else "")
        )
    items: list[tuple[str, Any]] = [
        ("run", _e(rd.run_id)),
        ("status", _e(res.get("status"))),
        ("server", _health(server)),
        (
            "method",
            _e("bootstrap (paper 000, Algorithm 1)" if rd.simulated else "real queries"),
        ),
        ("threat models", _e(", ".join(res.get("threat_models") or []))),
        ("dataset", _e(p.dataset)),
        ("canary", _e(f"{d.get('canary_kind')}: {d.get('canary')!r} ({d.get('canary_label')})")),
        (
            "attack",
            _e(
                f"{d.get('attack')}; present = {d.get('positive')!r}, "
                f"absent = {d.get('negative')!r}"
            ),
        ),
        ("neighbours", _e(f"replace-one at position {d.get('position')}")),
        ("mechanism", _e(mech)),
        ("confidence", _e(f"{p.confidence:.0%}")),
    ]
    if rd.simulated:
        items.append(
            (
                "bootstrap",
                _e(
                    f"n_llm={p.bootstrap.n_llm} clean rows per world, "
                    f"n_sample={p.bootstrap.n_sample:,} simulated trials per world"
                ),
            )
        )
    else:
        items.append(("trials", _e(f"{p.trials} per epsilon, concurrency {p.concurrency}")))
    items += [
        ("queries / LLM calls", _e(f"{res.get('queries')} / {res.get('llm_calls')}")),
        ("wall time", _e(f"{fmt(num(res.get('wall_time_s')), 1)} s")),
        ("verdict", _e(run_verdict(rows).upper())),
    ]
    for note in res.get("notes") or []:
        items.append(("note", _e(note)))
    return f"<h3>{_e(rd.label)}</h3><div class=scroll>{_kv(items)}</div>"


def render_html(
    title: str,
    runs: Sequence[RunData],
    rows: Sequence[ReportRow],
    images: Sequence[tuple[str, str, str]],
    notes: Sequence[str],
) -> str:
    findings = [
        f"<div class='finding {r.status}'>{_e(verdict_sentence(r))}</div>"
        for r in rows
        if r.status in ("violation", "bug", "nonconforming", "inconclusive")
    ]
    findings += [f"<div class='finding violation'>{_e(t)}</div>" for t in noise_findings(rows)]
    summary = []
    for rd in runs:
        status = run_verdict([r for r in rows if r.run_id == rd.run_id])
        words = {
            "violation": "the privacy claim is VIOLATED",
            "bug": "the server or the auditor has a BUG (epsilon_emp above epsilon_exact)",
            "nonconforming": "NONCONFORMING: the server does not release what the mechanism "
            "it reports would (see the findings)",
            "inconclusive": "INCONCLUSIVE at some epsilon: the audit could not have seen a "
            "violation there (see the findings)",
            "ok": "consistent with the claimed privacy at every epsilon audited, where the "
            "audit had the power to see a violation",
        }.get(status, "no estimate")
        summary.append(f"<div class='finding {status}'><b>{_e(rd.label)}</b>: {_e(words)}.</div>")
    if not findings:
        findings.append(
            "<div class='finding ok'>No audit found more leakage than claimed, and each had "
            "the power to see a violation: every epsilon_emp is at most epsilon_exact, which "
            "is at most epsilon_theory.</div>"
        )
    figs = "".join(
        f"<h2>{_e(h)}</h2><p class=small>{_e(cap)}</p>"
        f"<img alt='{_e(h)}' src='data:image/png;base64,{b64}'>"
        for h, cap, b64 in images
    )
    note_html = "".join(f"<li>{_e(n)}</li>" for n in notes)
    details = "".join(_run_details(rd, [r for r in rows if r.run_id == rd.run_id]) for rd in runs)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{_e(title)}</h1>
<p class=small>Generated {now} by dpicl-audit from the trial log. ε emp is a lower bound on the
server's real ε that holds with the stated confidence; ε exact is the true ε of the mechanism
at the noise the server reports (none for DPS-MOZO, whose claim is nominal); ε theory is the ε
the context was configured with. A white-box ε emp may approach ε exact; it can exceed ε exact
only through a bug, and ε theory only through a privacy violation.</p>
<h2>Verdicts</h2>{"".join(summary)}
<h2>Findings</h2>{"".join(findings)}
<h2>Results</h2>{_results_table(rows)}
<p class=small>* bootstrap: one collection of clean votes serves every ε; the wall time and LLM
calls shown are the whole run's. Real trials: the wall time of that ε's trials.</p>
{_noise_table(runs)}
{conformance_html(runs)}{ledger_html(runs)}{roc_html(runs)}
{f"<h2>Notes</h2><ul>{note_html}</ul>" if notes else ""}
{figs}
<h2>Runs</h2>{details}
</body></html>
"""
