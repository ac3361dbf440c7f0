"""Liveness (``/healthz``, ``/livez``: the process answers) and readiness (``/readyz``: the
database and the engine answer too), for orchestrators and load balancers."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from dpicl import __version__
from dpicl.api.deps import Svc
from dpicl.api.schemas import ErrorResponse, Health, Readiness
from dpicl.errors import EngineError, StorageUnavailable

router = APIRouter(tags=["health"])


def _health(svc: Svc, status: str = "ok") -> Health:
    return Health(
        status=status,
        version=__version__,
        engine=svc.engine.name,
        model=svc.engine.model,
        simulator=svc.engine.is_simulator,
        whitebox=svc.settings.whitebox,
    )


@router.get("/healthz", response_model=Health)
async def healthz(svc: Svc) -> Health:
    """Liveness, and which engine answers (the oracle is a labelled simulator)."""
    return _health(svc)


@router.get("/livez", response_model=Health)
async def livez(svc: Svc) -> Health:
    """Liveness: the process is up and its event loop answers (touches nothing else)."""
    return _health(svc)


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": ErrorResponse, "description": "database or engine not ready"}},
)
async def readyz(svc: Svc) -> Readiness:
    """Readiness: the database answers within DPICL_DB_TIMEOUT_S and the engine is loaded."""
    try:
        await asyncio.wait_for(svc.repo.ping(), timeout=svc.settings.db_timeout_s)
    except TimeoutError:
        raise StorageUnavailable(
            f"the database did not answer within {svc.settings.db_timeout_s} s"
        ) from None
    ready = getattr(svc.engine, "is_ready", None)
    if callable(ready) and not ready():
        raise EngineError(f"the {svc.engine.name} engine is not ready")
    return Readiness(**_health(svc).model_dump(), database="ok")
