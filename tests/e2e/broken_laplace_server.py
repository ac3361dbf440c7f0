"""Positive control for a mechanism added from outside: Laplace voting with a quarter of the
noise it reports.

The real app serving the installed ``laplace-voting`` plug-in (``examples/laplace_voting``),
with one change: its release draws Lap(b / 4) where the context reports the scale b = 2 /
epsilon. Everything reported (scale, epsilon, the ledger's charges, the debug ``scale``) is
unchanged. Started by ``tests/e2e/test_external_mechanism.py`` with the plug-in on
``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

import laplace_voting.server as laplace_server  # type: ignore[import-not-found]

NOISE_SHRINK = 4.0
WARNING = f"laplace-voting noise is {NOISE_SHRINK:g}x smaller than the reported scale"
"""What the server logs at start (:func:`tests.servers.serve_with_fault`)."""

_honest = laplace_server.laplace_vote


def broken_laplace_vote(scores: Any, scale: float, temperature: float, rng: Any) -> Any:
    """The plug-in's release with a quarter of its scale."""
    return _honest(scores, scale / NOISE_SHRINK, temperature, rng)


def install() -> None:
    """Patch the plug-in's release in this process (``answer`` looks the name up per call)."""
    laplace_server.laplace_vote = broken_laplace_vote
