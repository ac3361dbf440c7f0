"""Positive control: a private-voting server whose noise is 4x too small.

It is the real dpicl app with one change: the voting pipeline's ``private_vote`` is called
with ``sigma / 4``. Everything the server *reports* is unchanged: the context's sigma, its
epsilon and epsilon_exact, the ledger's charges and the debug endpoint's ``sigma``. Only the
noise actually added to the vote histogram is smaller. An auditor that trusts the reported
numbers cannot tell; one that measures must report a privacy violation.

Tests start it with ``start_server(env, fault="tests.e2e.broken_voting_server")``; by hand,
from the repository root (settings from ``DPICL_*`` as usual):

    python -m tests.servers tests.e2e.broken_voting_server PORT
"""

from __future__ import annotations

import numpy as np

import dpicl.mechanisms.voting.pipeline as voting_pipeline
from dpicl.mechanisms.voting.release import VotingRelease
from dpicl.mechanisms.voting.release import private_vote as honest_private_vote

NOISE_SHRINK = 4.0
WARNING = f"voting noise is {NOISE_SHRINK:g}x smaller than the reported sigma"
"""What the server logs at start (:func:`tests.servers.serve_with_fault`)."""


def broken_private_vote(
    scores: np.ndarray, sigma: float, temperature: float, rng: np.random.Generator
) -> VotingRelease:
    """The honest mechanism with a quarter of the noise it was configured with."""
    return honest_private_vote(scores, sigma / NOISE_SHRINK, temperature, rng)


def install() -> None:
    """Patch the voting pipeline in this process (the pipeline looks the name up per call)."""
    voting_pipeline.private_vote = broken_private_vote  # type: ignore[assignment]
