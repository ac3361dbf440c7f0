"""Liveness (``/healthz``, ``/livez``: the process answers) and readiness (``/readyz``: the
database and the engine answer too), for orchestrators and load balancers."""

from __future__ import annotations

import os

from fastapi import APIRouter

from dpicl import __version__
from dpicl.engines.placement import placement_of
from dpicl.engines.threads import ThreadPlan
from dpicl.errors import EngineError, StorageUnavailable
from dpicl.store.migrations import head
from dpicl.web.deps import Svc
from dpicl.web.schemas import ErrorResponse, Health, HealthLimits, Readiness

router = APIRouter(tags=["health"])

#: For the readiness route, whichever method asks.
_NOT_READY: dict[int | str, dict[str, object]] = {
    503: {
        "model": ErrorResponse,
        "description": "database, schema revision, engine or embedder not ready",
    }
}


def _health(svc: Svc, status: str = "ok") -> Health:
    s = svc.settings
    return Health(
        status=status,
        version=__version__,
        engine=svc.engine.name,
        model=svc.engine.model,
        simulator=svc.engine.is_simulator,
        whitebox=s.whitebox,
        # Published so that a client (the auditor) sizes its budgeted contexts within them
        # rather than learning them from refusals; none is a secret (a refusal names it).
        # Each field is the setting of the same name.
        limits=HealthLimits(**{k: getattr(s, k) for k in HealthLimits.model_fields}),
    )


# Each route answers HEAD as well as GET (FastAPI, unlike Starlette, does not add it; load
# balancers and uptime probes ask with HEAD): one decorator per method keeps the OpenAPI
# operation ids distinct.
@router.get("/healthz", response_model=Health)
@router.head("/healthz", response_model=Health, operation_id="healthz_head")
async def healthz(svc: Svc) -> Health:
    """Liveness, and which engine answers (the oracle is a labelled simulator)."""
    return _health(svc)


_NOT_LIVE: dict[int | str, dict[str, object]] = {
    503: {
        "model": ErrorResponse,
        "description": "the engine process's restarts keep failing (DPICL_ENGINE_RESTART_"
        "FAILURES_LIVE in a row): replace the server",
    }
}


@router.get("/livez", response_model=Health, responses=_NOT_LIVE)
@router.head("/livez", response_model=Health, responses=_NOT_LIVE, operation_id="livez_head")
async def livez(svc: Svc) -> Health:
    """Liveness: the event loop answers and the engine's restarts are not failing."""
    # A dead engine process is restarted by its supervisor (engine_unavailable, /readyz
    # 503, meanwhile); only restarts that keep failing are something a new pod may cure
    # (issue 47: with /livez always 200, nobody restarted a server whose engine was gone).
    why = getattr(svc.engine, "not_alive", None)
    reason = why() if callable(why) else None
    if reason:
        raise EngineError(reason)
    return _health(svc)


@router.get("/readyz", response_model=Readiness, responses=_NOT_READY)
@router.head("/readyz", response_model=Readiness, responses=_NOT_READY, operation_id="readyz_head")
async def readyz(svc: Svc) -> Readiness:
    """Readiness: database at the code's schema revision, engine and embedder loaded."""
    # Within DPICL_DB_TIMEOUT_S, or 503 storage_unavailable (the repository's deadline).
    revision = await svc.repo.schema_revision()
    needed = head()
    if revision != needed:
        raise StorageUnavailable(
            f"the database schema is at revision {revision or 'none (no schema)'}; this "
            f"server needs {needed}: run `dpicl migrate`"
        )
    ready = getattr(svc.engine, "is_ready", None)
    if callable(ready) and not ready():
        raise EngineError(f"the {svc.engine.name} engine is not ready")
    if svc.embedder_error is not None:
        raise EngineError(f"the sentence embedder failed to load at start: {svc.embedder_error}")
    embedder = "loaded" if svc.embedder is not None else "on first use"
    threads: ThreadPlan | None = getattr(svc.engine, "threads", None)
    return Readiness(
        **_health(svc).model_dump(),
        database="ok",
        schema_revision=revision,
        embedder=embedder,
        torch_threads=threads.intra if threads else None,
        torch_interop_threads=threads.interop if threads else None,
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY") or None,
        workers=svc.settings.workers,
        pid=os.getpid(),
        device_setting=svc.settings.device,
        **placement_of(svc.engine),
    )
