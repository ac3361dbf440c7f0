"""Request dependencies: the running services and the two kinds of bearer token."""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dpicl.config import Settings
from dpicl.engines.base import Embedder, Engine
from dpicl.errors import EngineError, NotFound, Unauthorized
from dpicl.privacy.ledger import Ledger
from dpicl.store.repository import ContextRepository, StoredContext, is_context_id

log = logging.getLogger("dpicl.api")


@dataclass
class Services:
    """Built once in the app's lifespan; shared by every request."""

    settings: Settings
    engine: Engine
    repo: ContextRepository
    ledger: Ledger
    embedder: Embedder | None = None
    #: Why the embedder failed to load at start (for /readyz); None once it loads.
    embedder_error: str | None = None
    _embedder_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def preload_embedder(self) -> None:
        """Load the embedder now (at start); a failure is kept for /readyz, not raised."""
        try:
            await self.get_embedder()
        except EngineError as exc:
            self.embedder_error = exc.message

    async def get_embedder(self) -> Embedder:
        """The sentence embedder, loaded on first use (only ESA needs it)."""
        async with self._embedder_lock:
            if self.embedder is None:
                from dpicl.engines.factory import build_embedder

                try:
                    self.embedder = await asyncio.to_thread(
                        build_embedder, self.settings.embedder, self.settings.device
                    )
                except EngineError as exc:
                    # Its message names files on this machine: for the operator's log only.
                    log.error("cannot load the embedder: %s", exc.message)
                    raise EngineError(
                        "the sentence embedder (DPICL_EMBEDDER) cannot be loaded on this "
                        "server; see its log"
                    ) from None
                self.embedder_error = None
            return self.embedder


# Every dependency is ``async def``: FastAPI runs a plain ``def`` dependency in the thread
# pool, one hop per dependency per request (11% of an oracle request's CPU, issue 13).
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


_bearer = HTTPBearer(auto_error=False)
Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
Svc = Annotated[Services, Depends(get_services)]


def _matches(token: str, candidates: list[str]) -> bool:
    # compare_digest on every candidate: no early exit that would time the key list.
    ok = False
    for c in candidates:
        ok |= secrets.compare_digest(token.encode(), c.encode())
    return ok


async def require_admin(creds: Creds, svc: Svc) -> None:
    token = svc.settings.admin_token
    if creds is None or token is None or not _matches(creds.credentials, [token]):
        raise Unauthorized("an admin bearer token is required (Authorization: Bearer <token>)")


async def require_user(creds: Creds, svc: Svc) -> None:
    allowed = [*svc.settings.api_keys]
    if svc.settings.admin_token:
        allowed.append(svc.settings.admin_token)
    if creds is None or not _matches(creds.credentials, allowed):
        raise Unauthorized("an API key is required (Authorization: Bearer <key>)")


async def load_context(context_id: str, svc: Services, *, for_query: bool = False) -> StoredContext:
    """The context ``context_id``, or 404. ``for_query``: a context about to be charged,
    which may come from the in-process cache (its ledger columns may be stale)."""
    ctx: StoredContext | None = None
    # An id that no context can have is not looked up (nor sent to the database).
    if is_context_id(context_id):
        ctx = await (svc.repo.get_for_query if for_query else svc.repo.get)(context_id)
    if ctx is None:
        raise NotFound(f"no context with id {context_id[:80]!r}", param="context_id")
    return ctx


Admin = Depends(require_admin)
User = Depends(require_user)
