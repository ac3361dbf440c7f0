"""Request ids, the access log and the request metrics: one pure ASGI middleware, outermost
in the app, so it sees every answer (a 413 of the body limit, a 503 of a timed-out
database) with its final status.

The request id is the caller's ``X-Request-ID`` when it is a short token of safe
characters (anything else is replaced, never echoed: a header is attacker-controlled and
ends up in log lines), else a fresh random one; it is returned in ``X-Request-ID`` and set
in :data:`dpicl.logging_setup.REQUEST_ID` for every log line written during the request.

One access-log line per request (logger ``dpicl.access``, level INFO): method, route
template, status, latency and the key id the authentication put in ``request.state.key_id``
(none for the admin token or an unauthenticated route). Never the path with its ids, the
query string, a header's value or a body.
"""

from __future__ import annotations

import logging
import re
import secrets
import time

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpicl.logging_setup import REQUEST_ID
from dpicl.metrics import REFUSALS, REQUEST_SECONDS, REQUESTS, REQUESTS_RUNNING, refusal_codes

__all__ = ["AccessLogMiddleware", "valid_request_id"]

log = logging.getLogger("dpicl.access")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: The route label of a path no route matches (a 404): bounded, unlike the paths.
UNMATCHED = "<unmatched>"


def valid_request_id(value: str | None) -> bool:
    """Whether a caller's ``X-Request-ID`` may be kept: 1-128 of ``A-Za-z0-9._:-``."""
    return value is not None and _REQUEST_ID.fullmatch(value) is not None


def _route_template(scope: Scope) -> str:
    # FastAPI puts the matched route in the scope; a request refused before routing (the
    # body limit's 413) has none yet, so the router is asked which route would match.
    route = scope.get("route")
    if route is None:
        app = scope.get("app")
        router = getattr(app, "router", None)
        for candidate in getattr(router, "routes", ()):
            if candidate.matches(scope)[0] == Match.FULL:
                route = candidate
                break
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


def count_refusal(route: str, status: int, codes: list[str]) -> None:
    """Count a request's error answer in ``dpicl_refusals_total``: the code its error
    response named (the last: a handler may answer an error met while answering another), or
    for an error status without one (a response no handler of ours wrote) ``http_<status>``.
    A refusal inside a stream already started keeps the stream's status."""
    if codes:
        REFUSALS.labels(route, str(status), codes[-1]).inc()
    elif status >= 400:
        REFUSALS.labels(route, str(status), f"http_{status}").inc()


class AccessLogMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        given = None
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                given = value.decode("latin-1")
                break
        rid = given if given is not None and valid_request_id(given) else secrets.token_hex(8)
        token = REQUEST_ID.set(rid)
        status = 500  # what the client gets if the app raises before answering
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        REQUESTS_RUNNING.inc()
        try:
            with refusal_codes() as codes:
                await self.app(scope, receive, send_with_id)
        finally:
            REQUESTS_RUNNING.dec()
            elapsed = time.perf_counter() - t0
            method = str(scope.get("method", "?"))
            route = _route_template(scope)
            REQUESTS.labels(method, route, str(status)).inc()
            REQUEST_SECONDS.labels(method, route).observe(elapsed)
            count_refusal(route, status, codes)
            state = scope.get("state") or {}
            log.info(
                "%s %s %d %.1f ms",
                method,
                route,
                status,
                elapsed * 1000,
                extra={
                    "request_id": rid,
                    "method": method,
                    "route": route,
                    "status": status,
                    "latency_ms": round(elapsed * 1000, 3),
                    "key_id": state.get("key_id") if isinstance(state, dict) else None,
                },
            )
            REQUEST_ID.reset(token)
