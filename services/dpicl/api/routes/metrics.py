"""``GET /metrics``: the server's Prometheus metrics (dpicl.metrics), registered when
``DPICL_METRICS`` is ``admin`` (behind the admin token: the per-context budget metrics name
context ids) or ``open`` (for a scraper on a private network); absent when ``off``."""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from dpicl.engines.memory import device_memory
from dpicl.metrics import DEVICE_MEMORY_BYTES, MULTIPROCESS_DIR_VAR
from dpicl.web.deps import require_admin
from dpicl.web.schemas import ErrorResponse


def exposition() -> bytes:
    """The metrics text: this process's, or, under ``DPICL_WORKERS`` (api/workers.py), every
    worker's from prometheus-client's multiprocess files (counters and histograms summed)."""
    if os.environ.get(MULTIPROCESS_DIR_VAR):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest()


def metrics_router(access: str) -> APIRouter:
    """The route, behind the admin token unless ``access`` is ``open``."""
    deps = [Depends(require_admin)] if access != "open" else []
    router = APIRouter(tags=["operations"], dependencies=deps)

    @router.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."},
            401: {"model": ErrorResponse},
        },
    )
    async def metrics(request: Request) -> Response:
        """This server's metrics in Prometheus text format (one replica's; scrape each)."""
        engine = request.app.state.services.engine
        if not getattr(engine, "relays_metrics", False):
            # The engine runs in this process: its memory is this process's, read now.
            for device, kind, value in device_memory(str(getattr(engine, "device", "cpu"))):
                DEVICE_MEMORY_BYTES.labels(device, kind).set(value)
        return Response(exposition(), media_type=CONTENT_TYPE_LATEST)

    return router
