"""Application factory: ``build_app(settings)``. The lifespan builds the engine, the store
and the ledger once; white-box routes are registered only when the operator opts in."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from dpicl import __version__
from dpicl.api.access_log import AccessLogMiddleware
from dpicl.api.body_timeout import BodyTimeoutMiddleware
from dpicl.api.docs import docs_router
from dpicl.api.errors import BodyLimitMiddleware, install_error_handlers
from dpicl.api.openai.router import router as openai_router
from dpicl.api.routes import contexts, debug, health, keys, queries, zero_shot
from dpicl.api.routes.metrics import metrics_router
from dpicl.config import Settings
from dpicl.engines.base import Embedder, Engine
from dpicl.mechanisms.registry import routers as mechanism_routers
from dpicl.privacy.accounting import MU2_RTOL
from dpicl.privacy.ledger import Ledger
from dpicl.store.repository import ContextRepository
from dpicl.web.deps import Services
from dpicl.web.schemas import ErrorResponse

log = logging.getLogger("dpicl")

DESCRIPTION = (
    "Differentially private in-context learning: private voting for classification, "
    "embedding space aggregation (ESA) for generation. Every answer reports its privacy "
    "cost and the context's remaining budget."
)

#: What any route may answer besides its own errors: an unreadable body (400 invalid_json),
#: a head or body that came too slowly (408), one too large (413, 414, 431; the server's
#: HTTP protocol answers those of the head, api/http_limits.py), a bad value (422), a database
#: that fails or times out or a server at its connection limit (503; nothing is charged).
COMMON_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorResponse, "description": "The body is not valid JSON (invalid_json)."},
    408: {
        "model": ErrorResponse,
        "description": "The head or body did not arrive within DPICL_HEADER_TIMEOUT_S or "
        "DPICL_BODY_TIMEOUT_S (request_timeout); the connection is closed.",
    },
    413: {"model": ErrorResponse, "description": "The body exceeds DPICL_MAX_BODY_BYTES."},
    414: {"model": ErrorResponse, "description": "The URL exceeds DPICL_MAX_HEADER_BYTES."},
    422: {"model": ErrorResponse, "description": "A value is invalid; `param` names it."},
    431: {
        "model": ErrorResponse,
        "description": "The header fields exceed DPICL_MAX_HEADER_BYTES or "
        "DPICL_MAX_HEADER_COUNT (headers_too_large); the connection is closed.",
    },
    503: {
        "model": ErrorResponse,
        "description": "storage_unavailable or engine_unavailable (nothing was charged), or "
        "server_busy (DPICL_MAX_CONNECTIONS reached; retry).",
    },
}


def announce_generated_token(settings: Settings) -> None:
    """Print the admin token generated because none was configured. Printed, not logged at
    debug: the operator needs it to administer the server."""
    if settings.admin_token is not None:
        print(
            f"dpicl: no DPICL_ADMIN_TOKEN configured; generated admin token: "
            f"{settings.admin_token.get_secret_value()}",
            flush=True,
        )


def build_app(
    settings: Settings, *, engine: Engine | None = None, embedder: Embedder | None = None
) -> FastAPI:
    """Build the app. ``engine`` may be injected (tests); otherwise DPICL_ENGINE decides."""
    settings, generated = settings.with_generated_secrets()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if generated:
            announce_generated_token(settings)
        if settings.whitebox != "off":
            log.warning(
                "SECURITY: white-box debug endpoints are ON (DPICL_WHITEBOX=%s). They release "
                "noisy%s internals to admin-token holders; never enable in production.",
                settings.whitebox,
                " and CLEAN" if settings.whitebox == "internal" else "",
            )
        repo = ContextRepository(
            settings.database_url,
            rtol=MU2_RTOL,
            timeout_s=settings.db_timeout_s,
            threads=settings.db_threads,
            cache_bytes=settings.context_cache_mb * 2**20,
            serialize_sqlite_writes=settings.db_serialize_sqlite_writes,
            group_commit_s=settings.ledger_group_commit_ms / 1000,
        )
        # Off the event loop, like every other database call (it may wait for a lock).
        await asyncio.to_thread(repo.migrate)
        eng = engine
        if eng is None:
            from dpicl.engines.factory import serve_engine

            eng = serve_engine(settings)
        if eng.is_simulator:
            log.warning("engine %r is a SIMULATOR, not a language model", eng.name)
        services = Services(
            settings=settings, engine=eng, repo=repo, ledger=Ledger(repo), embedder=embedder
        )
        app.state.services = services
        if embedder is None and settings.embedder_at_start():
            # Now, not on the first ESA request (seconds); /readyz reports a failure.
            await services.preload_embedder()
        # What start-up built (the engine, torch, scipy, the app: millions of objects) lives
        # as long as the server: frozen, the garbage collector stops scanning it. Each full
        # collection scanned all of it, 0.1-0.2 s, every few thousand answers (issue 30).
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            if engine is None:
                await eng.aclose()
            repo.dispose()

    app = FastAPI(
        title="dpicl",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        responses=COMMON_ERRORS,
        # Served by docs_router from local assets (no CDN), or not at all (DPICL_DOCS).
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=settings.body_timeout_s)
    # Added last, so outermost: it sees the final status of every answer (api/access_log.py).
    app.add_middleware(AccessLogMiddleware)
    # A request is matched against the routes in the order they were included: the
    # inference routes (nearly all the traffic) first, ahead of a dozen others that each
    # cost a match per answer (issue 30). No other route shares their paths.
    app.include_router(queries.router)
    app.include_router(health.router)
    app.include_router(contexts.router)
    for mechanism_router in mechanism_routers():  # DPS-MOZO's synthesis, ...
        app.include_router(mechanism_router)
    app.include_router(keys.router)
    app.include_router(zero_shot.router)
    app.include_router(openai_router)
    if settings.docs:
        app.include_router(docs_router(app))
    if settings.whitebox != "off":
        app.include_router(debug.router)
    if settings.metrics != "off":
        app.include_router(metrics_router(settings.metrics))
    return app
