"""What an audit's results flagged, one line each, for the message of a test's assertion.

A test that audits an honest server asserts that it exits 0. Every finding the run can state
has a stated false-alarm rate (the claims at the run's confidence, each test of the
conformance, channels and probes at 1e-4), so such an assertion fails now and then by
design; when it does, CI must say which finding fired and why, not only ``assert 4 == 0``
(2026-11-29: an honest run's exit 4 in CI left nothing else to read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FLAGGING", "findings"]

#: The statuses that make a run exit other than 0 at the defaults (INCONCLUSIVE exits 0).
FLAGGING = frozenset({"violation", "bug", "nonconforming", "refused", "error"})


def findings(results: Mapping[str, Any] | Sequence[Any], limit: int = 400) -> list[str]:
    """``path: status: message`` for every part of ``results`` (a run's JSON) whose status is
    in :data:`FLAGGING`, each message cut to ``limit`` characters."""
    out: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            status = node.get("status")
            if isinstance(status, str) and status in FLAGGING:
                out.append(f"{path or '/'}: {status}: {str(node.get('message', ''))[:limit]}")
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}/{i}")

    walk(results, "")
    return out
