"""The report's "From outside" section: each run's audits beside its settings' trials (the
ledger, the calibration scan, the client's parameters, every route's whole response, the
noise's tails: :data:`~dpicl_audit.probes.registry.PROBES`), each with its status, whether that
status decides the run's exit code, and its message, as the console prints them."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from dpicl_audit.report.data import RunData
from dpicl_audit.report.ledger_section import stacked

__all__ = ["probes_html"]

#: What each audit from outside looks at, for a reader who has not read docs/auditing.md.
WHAT: dict[str, str] = {
    "ledger": "the budget's accounting: sequentially and under bursts of concurrent requests",
    "calibration": "the noise the server reports at epsilons the plan does not audit",
    "parameters": "the release under each parameter a client controls (every parameter of "
    "the OpenAI SDK's and the server's request schemas, streaming), on every route",
    "surface": "every field, header and stream chunk of every answering route's response",
    "switches": "every route's answer under undocumented debug switches (query parameters, "
    "headers): no field beyond the documented ones",
    "limits": "queries and a canary exemplar sized at each documented limit: whether a refusal, "
    "its message or its charge tells the worlds apart",
    "tails": "how often each label comes back where the claimed noise must sometimes flip it",
}


def _e(text: Any) -> str:
    return html.escape(str(text))


def probes_html(runs: Sequence[RunData]) -> str:
    """``<h2>From outside</h2>``: one row per audit from outside of each run."""
    rows = []
    for rd in runs:
        took = rd.results.probe_wall_time_s
        for name, section, adds in rd.results.probes():
            status = str(section.get("status", ""))
            decides = "yes" if adds is not None else "no"
            secs = f"{took[name]:.1f}" if name in took else "-"
            rows.append(
                f"<tr><td>{_e(rd.label)}</td><td title='{_e(WHAT.get(name, ''))}'>{_e(name)}"
                f"</td><td class='{_e(status)}'>{_e(status)}</td><td>{decides}</td>"
                f"<td>{secs}</td><td class=wrap>{_e(section.get('message', ''))}</td></tr>"
            )
        rows += [
            f"<tr><td>{_e(rd.label)}</td><td title='{_e(WHAT.get(name, ''))}'>{_e(name)}</td>"
            "<td class=inconclusive>left out</td><td>no</td><td>-</td><td class=wrap>the plan "
            "left it out (--probes): the run could not have seen what it sees</td></tr>"
            for name in rd.results.probes_left_out
        ]
    if not rows:
        return ""
    what = "; ".join(f"<b>{_e(k)}</b>: {_e(v)}" for k, v in WHAT.items())
    return (
        "<h2>From outside</h2><p class=small>What the run checked beside its trials, as an "
        f"API-only client: {what}. A finding here sets the run's verdict and exit code as a "
        "setting's does (<i>flags</i>); ok, unchecked and refused probes do not.</p>"
        "<div class=scroll>"
        + stacked(
            "<table><tr><th>run</th><th>probe</th><th>status</th>"
            f"<th>flags</th><th>s</th><th>message</th></tr>{''.join(rows)}</table>"
        )
        + "</div>"
    )
