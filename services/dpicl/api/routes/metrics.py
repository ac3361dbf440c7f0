"""``GET /metrics``: this process's Prometheus metrics (dpicl.metrics), registered when
``DPICL_METRICS`` is ``admin`` (behind the admin token: the per-context budget metrics name
context ids) or ``open`` (for a scraper on a private network); absent when ``off``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dpicl.api.deps import require_admin
from dpicl.api.schemas import ErrorResponse


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
    async def metrics() -> Response:
        """This process's metrics in Prometheus text format (one replica's; scrape each)."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return router
