from __future__ import annotations

from fastapi import APIRouter

from dpicl import __version__
from dpicl.api.deps import Svc
from dpicl.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz(svc: Svc) -> Health:
    """Liveness, and which engine answers (the oracle is a labelled simulator)."""
    return Health(
        status="ok",
        version=__version__,
        engine=svc.engine.name,
        model=svc.engine.model,
        simulator=svc.engine.is_simulator,
        whitebox=svc.settings.whitebox,
    )
