"""Request dependencies: the running services, and who a bearer token acts for.

Three kinds of token: the admin token, static keys (``DPICL_API_KEYS``) and database keys
(``POST /v1/keys``). The first two are compared in memory; a database key is looked up on
every request (no cache: a revocation holds at once in every process; see
:mod:`dpicl.store.keys`). Every route that reaches a context goes through
:func:`load_context`, the one place where a key's scope is checked (before the context
is read).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dpicl.config import Settings
from dpicl.engines.base import Embedder, Engine
from dpicl.errors import EngineError, InvalidRequest, NotFound, Unauthorized
from dpicl.privacy.ledger import Ledger
from dpicl.store.keys import ADMIN, KEY_PREFIX, Principal, find_by_secret, static_key_id
from dpicl.store.repository import ContextRepository, StoredContext, is_context_id

log = logging.getLogger("dpicl.api")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class Tokens:
    """The admin token and the static keys, as SHA-256 digests: compared at equal length
    whatever the token's, so a comparison's time says nothing about its length either."""

    admin: bytes | None
    static: tuple[tuple[bytes, Principal], ...]

    @classmethod
    def of(cls, settings: Settings) -> Tokens:
        admin = settings.admin_token.get_secret_value() if settings.admin_token else None
        secrets_ = [k.get_secret_value() for k in settings.api_keys]
        static = tuple((_digest(k), Principal(static_key_id(k), "static")) for k in secrets_)
        return cls(admin=_digest(admin) if admin else None, static=static)

    def is_admin(self, token: str) -> bool:
        return self.admin is not None and secrets.compare_digest(_digest(token), self.admin)

    def match(self, token: str) -> Principal | None:
        """The admin or the static key ``token`` is, or None."""
        digest = _digest(token)
        found: Principal | None = None
        # compare_digest on every candidate: no early exit that would time the key list.
        if self.admin is not None and secrets.compare_digest(digest, self.admin):
            found = ADMIN
        for candidate, principal in self.static:
            if secrets.compare_digest(digest, candidate) and found is None:
                found = principal
        return found


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
    tokens: Tokens = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = Tokens.of(self.settings)

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
def services_of(request: Request) -> Services:
    """The running services (a plain function: the hot routes and the authentication read
    them without a dependency of their own, one fewer for FastAPI to solve per request)."""
    services: Services = request.app.state.services
    return services


async def get_services(request: Request) -> Services:
    return services_of(request)


_bearer = HTTPBearer(auto_error=False)
Creds = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
Svc = Annotated[Services, Depends(get_services)]


#: Longer than any token this server issues (a database key has 47 characters): such a
#: token is refused without a database lookup.
_MAX_KEY_CHARS = 200


async def require_admin(request: Request, creds: Creds) -> Principal:
    if creds is None:
        raise Unauthorized("an admin bearer token is required (Authorization: Bearer <token>)")
    if not services_of(request).tokens.is_admin(creds.credentials):
        raise Unauthorized(
            "the bearer token is not this server's admin token (DPICL_ADMIN_TOKEN); this "
            "route needs it"
        )
    request.state.key_id = ADMIN.key_id
    return ADMIN


async def require_user(request: Request, creds: Creds) -> Principal:
    """Who the bearer token acts for (the admin token is a key too), or 401. Sets
    ``request.state.key_id``, the caller's stable, non-secret id (for the access log)."""
    principal: Principal | None = None
    if creds is not None:
        svc = services_of(request)
        token = creds.credentials
        principal = svc.tokens.match(token)
        if principal is None and token.startswith(KEY_PREFIX) and len(token) <= _MAX_KEY_CHARS:
            key = await svc.repo.run(lambda conn: find_by_secret(conn, token))
            principal = key.principal() if key is not None else None
    if creds is None:
        raise Unauthorized("an API key is required (Authorization: Bearer <key>)")
    if principal is None:
        # One message for a key that never existed and one that was revoked: which keys
        # exist is not for a caller without a valid key to learn.
        raise Unauthorized(
            "the API key in Authorization is not valid: it is unknown or was revoked "
            "(ask the server's admin for a key)"
        )
    request.state.key_id = principal.key_id
    return principal


async def load_context(
    context_id: str,
    svc: Services,
    principal: Principal,
    *,
    for_query: bool = False,
    exemplars: bool = True,
) -> StoredContext:
    """The context ``context_id`` if ``principal`` reaches it, or 404: the same 404 as for a
    context that does not exist, so a key cannot probe for ids outside its scope.
    ``for_query``: a context about to be charged, which may come from the in-process cache
    (its ledger columns may be stale). ``exemplars=False``: its metadata only (an empty
    tuple of exemplars: never query through it).

    The scope is checked before the context is read, never after: a 404 must take the time
    of a missing id's too, whatever the size of the context it hides (issue 39). An id
    outside a key's list is refused without a lookup; a tenant key's lookup finds only its
    tenant's contexts (:func:`dpicl.store.repository._lookup`), in the cache as in the
    database (a cached context of another tenant is looked up as a missing one)."""
    ctx: StoredContext | None = None
    # An id that no context can have is not looked up (nor sent to the database).
    if is_context_id(context_id) and principal.may_reach(context_id):
        tenant = principal.lookup_tenant
        if for_query:
            ctx = await svc.repo.get_for_query(context_id, tenant=tenant)
        elif exemplars:
            ctx = await svc.repo.get(context_id, tenant=tenant)
        else:
            ctx = await svc.repo.get_info(context_id, tenant=tenant)
    if ctx is None or not principal.reaches(ctx.id, ctx.tenant):
        raise NotFound(f"no context with id {context_id[:80]!r}", param="context_id")
    return ctx


#: What an id, cursor or name in a URL may hold: printable ASCII without spaces. Every id
#: and cursor this server issues is of that form; anything else (NUL, a control character,
#: bytes that are not UTF-8, which arrive as U+FFFD) is refused here, by the schema, before
#: any route can hand it to the database (PostgreSQL refuses NUL in text with an error the
#: store would count as its own failure, issue 47).
URL_TOKEN_PATTERN = r"^[!-~]+$"
#: Longer than any id or cursor this server issues (a context cursor has 45 characters).
MAX_URL_TOKEN_CHARS = 200


def _path(description: str) -> Any:
    return Path(
        description=description,
        min_length=1,
        max_length=MAX_URL_TOKEN_CHARS,
        pattern=URL_TOKEN_PATTERN,
    )


#: A context id in a path (``/v1/contexts/{context_id}``); one of the right form that names
#: no context is a 404 (:func:`load_context`).
ContextIdPath = Annotated[str, _path("A context id (ctx_ and 24 hex digits).")]
#: A key id in a path (``/v1/keys/{key_id}``).
KeyIdPath = Annotated[str, _path("A key id (key_ and 24 hex digits).")]
#: A model (a context id) in a path of the OpenAI surface (``/v1/models/{model}``).
ModelPath = Annotated[str, _path("A context id.")]


def cursor_query(description: str, **schema: Any) -> Any:
    """A page cursor in the query string, checked like every URL token (None: the first
    page); ``schema``: more of its published schema (a pattern the route checks itself)."""
    return Query(
        description=description,
        json_schema_extra=schema or None,
        min_length=1,
        max_length=MAX_URL_TOKEN_CHARS,
        pattern=URL_TOKEN_PATTERN,
    )


Admin = Depends(require_admin)
User = Depends(require_user)
#: The principal of a user route (``User`` as a parameter): ``caller: Caller``.
Caller = Annotated[Principal, Depends(require_user)]
#: The principal of an admin route.
AdminCaller = Annotated[Principal, Depends(require_admin)]


def only_query_params(*names: str) -> Any:
    """A dependency that refuses a query parameter other than ``names`` (422 naming it): a
    misspelt cursor would silently list the first page again."""

    async def check(request: Request) -> None:
        for name in request.query_params:
            if name not in names:
                raise InvalidRequest(
                    f"unknown query parameter {name[:80]!r}; {request.url.path} takes "
                    + " and ".join(names),
                    param=name[:80] or None,
                )

    return Depends(check)
