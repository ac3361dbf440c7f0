"""Positive control: a DPS-MOZO server (proven mode) whose max-log-ratio constraint is twice
as loose as it claims.

It is the real dpicl app with one change: the pipeline's ``mozo_step`` is called with
``eps0 * 2`` in the proven mode, and the step's own ``log_ratios`` are clipped to the claimed
eps0 (the server lies about them). Everything else the server *reports* is unchanged: the
context's ``max_log_ratio``, ``per_token_epsilon`` and epsilon, the ledger's charges and the
debug endpoint's bounds. An auditor that trusts the reported ratios cannot tell; one that
recomputes them from the reported probabilities must report a privacy violation.

Tests start it with ``start_server(env, fault="tests.e2e.broken_mozo_server")``; by hand,
from the repository root (settings from ``DPICL_*`` as usual):

    python -m tests.servers tests.e2e.broken_mozo_server PORT
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import dpicl.mechanisms.dps_mozo.pipeline as mozo_pipeline
from dpicl.mechanisms.dps_mozo.release import MozoStep
from dpicl.mechanisms.dps_mozo.release import mozo_step as honest_mozo_step

EPS0_GROWTH = 2.0
WARNING = f"DPS-MOZO's eps0 is {EPS0_GROWTH:g}x larger than the reported one"
"""What the server logs at start (:func:`tests.servers.serve_with_fault`)."""


def broken_mozo_step(*args: Any, eps0: float | None = None, **kwargs: Any) -> MozoStep:
    """The honest step with ``EPS0_GROWTH`` times the configured eps0, reporting log-ratios
    that never exceed the configured eps0."""
    if eps0 is None:  # the paper's mode is left as it is
        return honest_mozo_step(*args, **kwargs)
    step = honest_mozo_step(*args, eps0=eps0 * EPS0_GROWTH, **kwargs)
    return dataclasses.replace(step, log_ratios=np.minimum(step.log_ratios, eps0))


def install() -> None:
    """Patch the DPS-MOZO pipeline in this process (it looks the name up per call)."""
    mozo_pipeline.mozo_step = broken_mozo_step  # type: ignore[assignment]
