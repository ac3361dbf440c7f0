"""Positive controls for ESA: the real dpicl app with one deliberate bug in the mechanism.

    python tests/e2e/broken_esa_server.py PORT sum      (settings from DPICL_* as usual)
    python tests/e2e/broken_esa_server.py PORT noise

* ``sum``: the partition embeddings are aggregated by their SUM instead of their mean (the
  1/T of Algorithm 3, line 7 of paper 000 forgotten) while the noise stays calibrated for
  the mean's sensitivity 2/T: the release is then T times less private than claimed.
* ``noise``: the noise added to the mean is 4x smaller than the configured sigma.

Everything the server *reports* is unchanged: the context's sigma, epsilon, epsilon_exact,
the ledger's charges and the debug endpoint's ``sigma``. Only the released text shows it.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import dpicl.pipelines.esa as esa_pipeline
from dpicl.mechanisms.esa import EsaRelease
from dpicl.mechanisms.esa import esa_release as honest_esa_release

NOISE_SHRINK = 4.0
MODES = ("sum", "noise")


def summing_release(
    partition_embeddings: Any, candidate_embeddings: Any, sigma: float, rng: np.random.Generator
) -> EsaRelease:
    """The honest release of T x the mean (= the sum), with the mean's noise."""
    emb = np.asarray(partition_embeddings, dtype=np.float64)
    return honest_esa_release(emb * emb.shape[0], candidate_embeddings, sigma, rng)


def quiet_release(
    partition_embeddings: Any, candidate_embeddings: Any, sigma: float, rng: np.random.Generator
) -> EsaRelease:
    """The honest release with a quarter of the configured noise."""
    return honest_esa_release(partition_embeddings, candidate_embeddings, sigma / NOISE_SHRINK, rng)


def install(mode: str) -> None:
    """Patch the ESA pipeline in this process (it looks ``esa_release`` up per call)."""
    if mode not in MODES:
        raise SystemExit(f"mode must be one of {MODES}, got {mode!r}")
    esa_pipeline.esa_release = summing_release if mode == "sum" else quiet_release  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    import logging

    import uvicorn

    from dpicl.api.app import build_app
    from dpicl.config import Settings

    if len(argv) != 2:
        raise SystemExit("usage: broken_esa_server.py PORT sum|noise")
    port, mode = int(argv[0]), argv[1]
    install(mode)
    settings = Settings().model_copy(update={"host": "127.0.0.1", "port": port})
    logging.basicConfig(level=settings.log_level.upper())
    logging.getLogger("dpicl").warning("POSITIVE CONTROL: broken ESA mechanism (%s)", mode)
    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=port,
        log_level=settings.log_level,
        access_log=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
