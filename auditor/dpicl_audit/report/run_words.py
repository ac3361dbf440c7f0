"""The words the report's page uses for runs as a whole: the overall verdict line that opens
the page (the terminal's first line too), a run's stored status, and the server's /healthz
in one line (issue 45)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from dpicl_audit.jsontypes import JsonMapping
from dpicl_audit.report.words import VERDICT_WORDS
from dpicl_audit.results.overall import Overall

__all__ = ["STATUS_WORDS", "health_line", "overall_html"]


def _e(text: Any) -> str:
    return html.escape(str(text))


#: A run's stored status in words: the demo stops a real run at its share of the time, which
#: is not an interruption (issue 45).
STATUS_WORDS = {
    "completed": "completed",
    "time-limited": "stopped at its time limit: the report estimates from its logged trials",
    "interrupted": "interrupted (Ctrl-C or killed): resume continues it",
    "failed": "failed",
    "running": "running, or stopped without a word (killed): resume continues it",
}


def overall_html(overall: Overall | None) -> str:
    """The page's first line: the overall verdict and the exit status ``dpicl-audit report``
    gives for it, as the terminal prints it (issue 45)."""
    if overall is None or overall.status is None:
        return ""
    status = overall.status.value
    word = VERDICT_WORDS.get(status, status)
    if status == "inconclusive" and overall.exit_code == 0:
        word = "no violation seen"
    return (
        f"<p class='overall finding {_e(status)}' id=overall><span class='badge {_e(status)}'>"
        f"{_e(word)}</span> {_e(overall.line.removeprefix('verdict: '))}</p>"
    )


def health_line(server: JsonMapping) -> str:
    """The server's /healthz as one line of ``key=value`` (nested values inline, empty ones
    left out); its ``status`` is the server's liveness, so it is named so (issue 45: a nested
    table showed an empty row and a second "status")."""
    parts = []
    for key in sorted(server):
        value = server[key]
        if isinstance(value, Mapping):
            value = ", ".join(f"{k}={v}" for k, v in value.items() if v not in (None, ""))
        if value in (None, "", [], {}):
            continue
        parts.append(f"{'liveness' if key == 'status' else key}={value}")
    return _e("; ".join(parts)) if parts else "not recorded (the run kept no /healthz)"
