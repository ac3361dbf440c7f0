"""Positive control: a DPS-MOZO server (proven mode) whose max-log-ratio constraint is twice
as loose as it claims.

It is the real dpicl app with one change: the pipeline's ``mozo_step`` is called with
``eps0 * 2`` in the proven mode, and the step's own ``log_ratios`` are clipped to the claimed
eps0 (the server lies about them). Everything else the server *reports* is unchanged: the
context's ``max_log_ratio``, ``per_token_epsilon`` and epsilon, the ledger's charges and the
debug endpoint's bounds. An auditor that trusts the reported ratios cannot tell; one that
recomputes them from the reported probabilities must report a privacy violation.

    python tests/e2e/broken_mozo_server.py PORT        (settings from DPICL_* as usual)
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np

import dpicl.pipelines.mozo as mozo_pipeline
from dpicl.mechanisms.mozo import MozoStep
from dpicl.mechanisms.mozo import mozo_step as honest_mozo_step

EPS0_GROWTH = 2.0


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


def main(argv: list[str]) -> None:
    import logging

    import uvicorn

    from dpicl.api.app import build_app
    from dpicl.config import Settings

    if len(argv) != 1:
        raise SystemExit("usage: broken_mozo_server.py PORT")
    port = int(argv[0])
    install()
    settings = Settings().model_copy(update={"host": "127.0.0.1", "port": port})
    logging.basicConfig(level=settings.log_level.upper())
    logging.getLogger("dpicl").warning(
        "POSITIVE CONTROL: DPS-MOZO's eps0 is %gx larger than the reported one", EPS0_GROWTH
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
