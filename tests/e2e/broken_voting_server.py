"""Positive control: a private-voting server whose noise is 4x too small.

It is the real dpicl app with one change: the voting pipeline's ``private_vote`` is called
with ``sigma / 4``. Everything the server *reports* is unchanged: the context's sigma, its
epsilon and epsilon_exact, the ledger's charges and the debug endpoint's ``sigma``. Only the
noise actually added to the vote histogram is smaller. An auditor that trusts the reported
numbers cannot tell; one that measures must report a privacy violation.

    python tests/e2e/broken_voting_server.py PORT        (settings from DPICL_* as usual)
"""

from __future__ import annotations

import sys

import numpy as np

import dpicl.pipelines.voting as voting_pipeline
from dpicl.mechanisms.voting import VotingRelease
from dpicl.mechanisms.voting import private_vote as honest_private_vote

NOISE_SHRINK = 4.0


def broken_private_vote(
    scores: np.ndarray, sigma: float, temperature: float, rng: np.random.Generator
) -> VotingRelease:
    """The honest mechanism with a quarter of the noise it was configured with."""
    return honest_private_vote(scores, sigma / NOISE_SHRINK, temperature, rng)


def install() -> None:
    """Patch the voting pipeline in this process (the pipeline looks the name up per call)."""
    voting_pipeline.private_vote = broken_private_vote  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    import logging

    import uvicorn

    from dpicl.api.app import build_app
    from dpicl.config import Settings

    if len(argv) != 1:
        raise SystemExit("usage: broken_voting_server.py PORT")
    port = int(argv[0])
    install()
    settings = Settings().model_copy(update={"host": "127.0.0.1", "port": port})
    logging.basicConfig(level=settings.log_level.upper())
    logging.getLogger("dpicl").warning(
        "POSITIVE CONTROL: voting noise is %gx smaller than the reported sigma", NOISE_SHRINK
    )
    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=port,
        log_level=settings.log_level,
        access_log=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
