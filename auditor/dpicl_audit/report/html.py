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

from dpicl_audit.jsontypes import JsonMapping, JsonValue
from dpicl_audit.report.cards import cards, run_style
from dpicl_audit.report.data import ReportRow, RunData, num
from dpicl_audit.report.ledger_section import (
    STACK_CSS,
    conformance_html,
    ledger_html,
    roc_html,
    stacked,
)
from dpicl_audit.report.probes import probes_html
from dpicl_audit.report.run_words import STATUS_WORDS, health_line, overall_html
from dpicl_audit.report.utility_card import CARD_CSS
from dpicl_audit.report.words import (
    VERDICT_WORDS,
    eps_label,
    fmt,
    noise_findings,
    run_verdict,
    verdict_sentence,
)
from dpicl_audit.results.overall import Overall

__all__ = ["noise_status", "render_html"]

_CSS = """
*{box-sizing:border-box}
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.2em auto;
max-width:1180px;color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.5em;margin:.2em 0 .3em;overflow-wrap:anywhere}
h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
h3{overflow-wrap:anywhere}
.scroll{max-width:100%;overflow-x:auto;margin:.6em 0}
table{border-collapse:collapse;font-size:.86em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
td.wrap{overflow-wrap:anywhere;max-width:60ch}
table.kv{max-width:100%}table.kv td{overflow-wrap:anywhere}
.violation{background:#fde0e0;color:#900;font-weight:bold}
.bug{background:#fff3cd;color:#7a5b00;font-weight:bold}
.nonconforming{background:#f3e5f5;color:#5c1a6b;font-weight:bold}
.ok{color:#17652a}.error{color:#777}.inconclusive{color:#6b5900}
.nw{white-space:nowrap}
.finding{padding:.45em .8em;margin:.3em 0;border-left:5px solid #999;background:#fafafa;
overflow-wrap:anywhere}
.finding.violation{border-color:#c00}.finding.bug{border-color:#d9a400}
.finding.nonconforming{border-color:#8e24aa}
.finding.ok{border-color:#2a8a3e}.finding.inconclusive{border-color:#888;color:#222}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:.6em;
margin:.6em 0}
.card{border:1px solid #ddd;border-top:6px solid var(--run);border-radius:4px;
padding:.45em .7em;background:#fff;min-width:0}
.card .name{font-weight:bold;overflow-wrap:anywhere}
.badge{display:inline-block;white-space:nowrap;font-weight:bold;font-size:.82em;
padding:.05em .5em;border-radius:3px;margin:.25em 0}
.badge.ok{background:#dff3e3;color:#17652a}.badge.inconclusive{background:#eee;color:#444}
.badge.violation{background:#c00;color:#fff}.badge.bug{background:#f0c000;color:#222}
.badge.error{background:#eee;color:#777}.badge.nonconforming{background:#8e24aa;color:#fff}
.bars{font-size:.8em;width:100%;border:0;margin-top:.2em}
.bars td{border:0;padding:.1em .3em;vertical-align:middle}
.track{position:relative;height:.8em;background:#eef;border-radius:2px;min-width:6em}
.track .emp{position:absolute;left:0;top:0;bottom:0;background:var(--run)}
.track .exact{position:absolute;top:-.2em;bottom:-.2em;width:2px;background:#333}
.track .theory{position:absolute;top:-.2em;bottom:-.2em;width:0;border-left:2px dashed #c00}
.swatch{display:inline-block;width:.8em;height:.8em;background:var(--run);margin-right:.3em;
vertical-align:-.05em;border-radius:2px}
details{margin:.35em 0;border:1px solid #e4e4e4;border-radius:4px;padding:.2em .6em}
summary{cursor:pointer;font-weight:bold;overflow-wrap:anywhere}
img{max-width:100%;height:auto;border:1px solid #eee}code{background:#f4f4f4;padding:0 .25em}
.small{font-size:.85em;color:#555}
.overall{font-size:1.05em;font-weight:bold}
table.results td.wrap{overflow-wrap:break-word}
@media (max-width:640px){
table.results,table.results tbody{display:block;border:0}
table.results tr.head{display:none}
table.results tr{display:grid;grid-template-columns:1fr 1fr;column-gap:1em;
border:1px solid #ccc;border-left:6px solid var(--run,#ccc);border-radius:4px;margin:.5em 0;
padding:.2em .4em}
table.results td{display:flex;justify-content:space-between;gap:1em;border:0;
padding:.1em .2em;max-width:none;white-space:normal}
table.results td::before{content:attr(data-label);font-weight:normal;color:#555;
text-align:left;white-space:nowrap}
table.results td.name{display:block;font-weight:bold;grid-column:1/-1}
table.results td.name::before{content:none}
}
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _results_table(
    rows: Sequence[ReportRow], labels: Mapping[str, str], colors: Mapping[str, str]
) -> str:
    shift = any(r.epsilon_exact_shift is not None for r in rows)
    head = (
        "<tr class=head><th class=l>run</th><th class=l>ε</th><th class=l>threat</th>"
        "<th>ε theory</th><th>ε exact</th>"
        + (
            "<th title='ESA: exact ε for the canary&#39;s actual embedding shift'>"
            "ε exact (shift)</th>"
            if shift
            else ""
        )
        + "<th title='GDP figure: epsilon of mu_lower, assumes a Gaussian trade-off'>"
        "ε emp (GDP)</th><th title='assumption-free (epsilon, delta) bound, its own threshold'>"
        "ε classical</th><th>μ lower</th><th>trials</th><th class=l>verdict</th></tr>"
    )
    body = []
    for r in rows:
        verdict = VERDICT_WORDS.get(r.status, r.status)
        if r.noise_check and r.noise_check.get("status") == "smaller":
            verdict += " · noise < claim"
        trials = "-" if r.trials is None else f"{r.trials:,}"
        if r.method == "bootstrap":
            trials += " sim"
        # data-label: on a phone (CSS, max-width 640px) each row is a card of "label value"
        # lines, the run's name across its top, instead of a table scrolled sideways.
        body.append(
            f"<tr{run_style(colors, r.run_id)}><td class='l wrap name'>"
            f"<span class=swatch></span>{_e(labels.get(r.run_id, r.run_id))}</td>"
            f"<td class='l nw' data-label='ε'>{_e(eps_label(r.setting))}</td>"
            f"<td class='l nw' data-label='threat'>{_e(r.threat)}</td>"
            f"<td data-label='ε theory'>{fmt(r.epsilon_theory, 2)}</td>"
            f"<td data-label='ε exact'>{fmt(r.epsilon_exact)}</td>"
            + (
                f"<td data-label='ε exact (shift)'>{fmt(r.epsilon_exact_shift)}</td>"
                if shift
                else ""
            )
            + f"<td data-label='ε emp (GDP)'><b>{fmt(r.epsilon_emp)}</b></td>"
            f"<td data-label='ε classical'>{fmt(r.epsilon_classic)}</td>"
            f"<td data-label='μ lower'>{fmt(r.mu_lower)}</td>"
            f"<td class=nw data-label='trials'>{trials}</td>"
            f"<td class='l nw {_e(r.status)}' data-label='verdict' title='{_e(r.message)}'>"
            f"{_e(verdict)}</td></tr>"
        )
    return f"<div class=scroll><table class=results>{head}{''.join(body)}</table></div>"


def sigma_interval(nc: JsonMapping) -> tuple[JsonValue, JsonValue]:
    """A noise check's interval on the measured sigma: ``sigma_interval``, or the
    ``sigma_lower`` and ``sigma_upper`` of logs written before it ((None, None) where it
    has neither)."""
    interval = nc.get("sigma_interval") or [nc.get("sigma_lower"), nc.get("sigma_upper")]
    return (interval[0], interval[1]) if isinstance(interval, list) else (None, None)


def noise_status(nc: JsonMapping) -> str:
    """consistent | inconclusive | smaller | larger | unchecked, for voting's check
    (noise_check.py) and ESA's (chi-square on the mean), which name things apart. A
    "consistent" interval wider than the sigma it measured confirms nothing: inconclusive
    (logs written before noise_check.py said so are read the same way)."""
    lo, hi = (num(v) for v in sigma_interval(nc))
    hat = num(nc.get("sigma_measured", nc.get("sigma_hat")))
    reported = num(nc.get("sigma_reported", nc.get("claimed_sigma")))
    status = nc.get("status")
    if status is None:
        if nc.get("consistent") is None:
            return "unchecked"
        if not nc["consistent"]:
            small = hi is not None and reported is not None and hi < reported
            return "smaller" if small else "larger"
        status = "consistent"
    wide = lo is not None and hi is not None and hat is not None and hi - lo > hat
    if status == "consistent" and wide:
        return "inconclusive"
    return str(status)


_NOISE_WORDS = {
    "consistent": "consistent",
    "inconclusive": "not confirmed",
    "smaller": "NOISE SMALLER THAN CLAIMED",
    "larger": "noise larger than claimed",
    "unchecked": "unchecked",
}


def _noise_table(runs: Sequence[RunData], colors: Mapping[str, str]) -> str:
    """The bootstrap's noise check per (run, epsilon): reported vs measured sigma."""
    body = []
    for rd in runs:
        for s in rd.results.settings:
            nc = s.noise_check
            if not isinstance(nc, Mapping):
                continue
            lo, hi = sigma_interval(nc)
            measured = nc.get("sigma_measured", nc.get("sigma_hat"))
            reported = nc.get("sigma_reported", nc.get("claimed_sigma"))
            status = noise_status(nc)
            css = {"smaller": "violation", "consistent": "ok"}.get(status, "inconclusive")
            message = str(nc.get("message") or "")
            if status == "inconclusive" and not message.startswith("INCONCLUSIVE"):
                message = (
                    f"the interval is wider than the measured sigma {fmt(num(measured))}: too "
                    f"few residuals to confirm the noise ({message})"
                )
            body.append(
                f"<tr><td class='l wrap'{run_style(colors, rd.run_id)}><span class=swatch>"
                f"</span>{_e(rd.label)}</td>"
                f"<td class='l nw'>{_e(eps_label(str(s.setting)))}</td>"
                f"<td>{fmt(num(reported))}</td>"
                f"<td>{fmt(num(measured))}</td>"
                f"<td class=nw>[{fmt(num(lo))}, {fmt(num(hi))}]</td>"
                f"<td>{fmt(num(s.extra.get('sigma_simulated')))}</td>"
                f"<td class='l nw {css}'>{_e(_NOISE_WORDS.get(status, status))}</td>"
                f"<td class='l wrap small'>{_e(message)}</td></tr>"
            )
    if not body:
        return ""
    head = (
        "<tr><th class=l>run</th><th class=l>ε</th><th>σ reported</th><th>σ measured</th>"
        "<th>interval</th><th>σ simulated</th><th class=l>check</th><th class=l>why</th></tr>"
    )
    return (
        "<h2>Noise check</h2><p class=small>The bootstrap adds noise itself, so it first "
        "measures the noise the server really adds (noisy − clean residuals) and simulates "
        "with the conservative value when the measurement is below the claim. An interval "
        "wider than the sigma it measured is <i>not confirmed</i>: it confirms nothing, and "
        "decides nothing either: the run's verdict (its card) does not rest on it, since the "
        "bootstrap simulates with the reported sigma unless the measurement shows less. Only "
        "a noise measured smaller than claimed is a finding.</p>"
        f"<div class=scroll>{stacked(f'<table>{head}{chr(10).join(body)}</table>')}</div>"
    )


def _kv(items: Sequence[tuple[str, Any]]) -> str:
    li = "".join(f"<tr><td class=l>{_e(k)}</td><td class=l>{v}</td></tr>" for k, v in items)
    return f"<table class=kv>{li}</table>"


def _run_details(rd: RunData, rows: Sequence[ReportRow]) -> str:
    p, d, res = rd.plan, rd.results.design, rd.results
    m = p.mechanism
    server = res.server
    mech = m.describe()  # each mechanism's settings say what the report shows of them
    items: list[tuple[str, Any]] = [
        ("run", _e(rd.run_id)),
        ("run status", _e(STATUS_WORDS.get(str(res.status), res.status))),
        ("server (/healthz)", health_line(server)),
        (
            "method",
            _e("bootstrap (paper 000, Algorithm 1)" if rd.simulated else "real queries"),
        ),
        ("threat models", _e(", ".join(res.threat_models))),
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
        ("queries / LLM calls", _e(f"{res.queries} / {res.llm_calls}")),
        ("wall time", _e(f"{fmt(num(res.wall_time_s), 1)} s")),
        ("verdict", _e(run_verdict(rows, rd.probe_statuses).upper())),
    ]
    for note in res.extra.get("notes") or []:
        items.append(("note", _e(note)))
    return f"<summary>{_e(rd.label)}</summary><div class=scroll>{_kv(items)}</div>"


def render_html(
    title: str,
    runs: Sequence[RunData],
    rows: Sequence[ReportRow],
    images: Sequence[tuple[str, str, str]],
    notes: Sequence[str],
    colors: Mapping[str, str] | None = None,
    utility_html: str = "",
    why_inconclusive: str = "",
    overall: Overall | None = None,
) -> str:
    """The page: one card per run first (name, verdict, ε bars), the privacy-utility card
    (``utility_html``, when utility runs are reported), then the findings grouped by run
    behind disclosures, the compact table, the noise check, the plots, the details."""
    colors = colors or {}
    labels = {rd.run_id: rd.label for rd in runs}
    groups = []
    for rd in runs:
        mine = [r for r in rows if r.run_id == rd.run_id]
        items = [
            f"<div class='finding {r.status}'>{_e(verdict_sentence(r))}</div>"
            for r in mine
            if r.status in ("violation", "bug", "nonconforming", "inconclusive")
        ]
        items += [f"<div class='finding violation'>{_e(t)}</div>" for t in noise_findings(mine)]
        items += [
            f"<div class='finding {_e(adds.value)}'>{_e(name)}: {_e(section.get('message'))}</div>"
            for name, section, adds in rd.results.probes()
            if adds is not None
        ]
        if not items:
            continue
        status = run_verdict(mine, rd.probe_statuses)
        # a violation, a bug or a nonconformity is open from the start; the rest wait for a click
        opened = " open" if status in ("violation", "bug", "nonconforming") else ""
        groups.append(
            f"<details{opened}><summary{run_style(colors, rd.run_id)}><span class=swatch>"
            f"</span>{_e(rd.label)}: {len(items)} finding{'s' if len(items) > 1 else ''} "
            f"<span class='badge {_e(status)}'>{_e(VERDICT_WORDS.get(status, status))}"
            f"</span></summary>{''.join(items)}</details>"
        )
    if not groups:
        groups.append(
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
    details = "".join(
        f"<details>{_run_details(rd, [r for r in rows if r.run_id == rd.run_id])}</details>"
        for rd in runs
    )
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}{CARD_CSS}{STACK_CSS}</style></head><body>
<h1>{_e(title)}</h1>
{overall_html(overall)}
{cards(runs, rows, colors, why_inconclusive)}
<p class=small>Bars, per ε audited: <b>ε emp</b> (filled, the run's largest lower bound at its
confidence) against <b>ε exact</b> (black tick: the true ε of the mechanism at the noise the
server reports) and <b>ε theory</b> (dashed red tick: the ε the context was configured with).
ε emp can exceed ε exact only through a bug, and ε theory only through a privacy violation.
Generated {now} by dpicl-audit from the trial log.</p>
{utility_html}
<h2>Findings</h2>{"".join(groups)}
<h2>Results</h2>{_results_table(rows, labels, colors)}
<p class=small>sim: bootstrap trials, simulated from n_llm clean vote vectors per world. A
verdict's reason is in its findings above (and in the cell's tooltip).</p>
{_noise_table(runs, colors)}
{conformance_html(runs)}{probes_html(runs)}{ledger_html(runs)}{roc_html(runs)}
{f"<h2>Notes</h2><ul>{note_html}</ul>" if notes else ""}
{figs}
<h2>Runs</h2>{details}
</body></html>
"""
