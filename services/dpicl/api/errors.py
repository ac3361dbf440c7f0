"""Map every failure to the one error shape ``{"error": {"code", "message", "param"}}``."""

from __future__ import annotations

import logging
import math
import traceback
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpicl.api.openai.errors import is_openai_path, openai_error_response
from dpicl.domain import NO_NUL, NONBLANK_NO_NUL
from dpicl.errors import DpiclError, EngineError, PayloadTooLarge, StorageUnavailable
from dpicl.metrics import note_refusal
from dpicl.web.deps import URL_TOKEN_PATTERN

log = logging.getLogger("dpicl.api")


def error_response(
    status: int,
    code: str,
    message: str,
    param: str | None = None,
    headers: Any = None,
    *,
    path: str = "",
) -> JSONResponse:
    """The error in dpicl's shape, or in OpenAI's on the OpenAI-compatible ``path``s."""
    # Counted by the access log, with its route and final status, on every surface.
    note_refusal(code)
    if code == "budget_exhausted":
        # No waiting refills a privacy budget: say so to every client that reads it (the
        # OpenAI SDKs do), and give no Retry-After, on both surfaces.
        headers = {k: v for k, v in dict(headers or {}).items() if k.lower() != "retry-after"}
        headers["x-should-retry"] = "false"
    if is_openai_path(path):
        return openai_error_response(status, code, message, param, headers)
    body = {"error": {"code": code, "message": message, "param": param}}
    return JSONResponse(status_code=status, content=body, headers=headers)


def _param(loc: tuple[Any, ...]) -> str | None:
    # The first element is where the value came from (body, query string, path, header).
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    parts = [str(p) for p in loc]
    # Discriminated unions add the tag to the location (mechanism.voting.epsilon).
    return ".".join(parts) or None


_TEXT_PATTERNS = {
    NONBLANK_NO_NUL: "must contain a visible character (not only whitespace, control or "
    "invisible characters such as U+200B ZERO WIDTH SPACE) and no NUL",
    NO_NUL: "must not contain NUL (U+0000)",
    URL_TOKEN_PATTERN: "must be printable ASCII without spaces, as every id and cursor this "
    "server issues is",
}


#: Request fields whose values are private: an error names where the bad value is (its
#: index and field: ``exemplars.3.input``), never what it is.
_PRIVATE_FIELDS = frozenset({"exemplars"})


def _may_echo(error: dict[str, Any]) -> bool:
    """Whether an invalid value may be quoted back: a scalar outside every private field. A
    list or object could hold private text (the whole body, an exemplar's object)."""
    loc = [str(p) for p in error.get("loc", ())]
    value = error.get("input")
    if isinstance(value, dict | list | tuple):
        return False
    return not any(p in _PRIVATE_FIELDS for p in loc)


def _validation(exc: RequestValidationError, content_type: str | None, path: str) -> JSONResponse:
    errors = list(exc.errors())
    first: dict[str, Any] = (
        dict(errors[0]) if errors else {"loc": (), "msg": "invalid request", "type": ""}
    )
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        loc = tuple(first.get("loc", ()))
        at = f" at character {loc[1]}" if len(loc) == 2 and isinstance(loc[1], int) else ""
        return error_response(
            400,
            "invalid_json",
            f"request body is not valid JSON: {ctx.get('error', '')}{at}",
            path=path,
        )
    if tuple(first.get("loc", ())) == ("body",) and isinstance(first.get("input"), bytes):
        # FastAPI hands the body over unparsed unless it is declared JSON: the body is not
        # wrong, its Content-Type is (and echoing the raw bytes would help nobody).
        return error_response(
            422,
            "invalid_request",
            "request body: send JSON with Content-Type: application/json "
            + (f"(got {content_type!r})" if content_type else "(it has no Content-Type)"),
            path=path,
        )
    param = _param(tuple(first.get("loc", ())))
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "string_pattern_mismatch":
        # The text patterns are long character classes; say what they mean instead.
        msg = _TEXT_PATTERNS.get(str((first.get("ctx") or {}).get("pattern")), msg)
    if "input" in first and first.get("type") != "missing" and _may_echo(first):
        shown = repr(first["input"])
        if len(shown) > 120:
            shown = shown[:117] + "..."
        msg = f"{msg} (got {shown})"
    msg = f"{param}: {msg}" if param else f"request body: {msg}"
    if first.get("type") == "missing" and param:
        msg = f"{param}: field required"
    return error_response(422, "invalid_request", msg, param, path=path)


def _unreadable_json(cause: BaseException | None) -> str:
    """What made json.loads give up on a body, naming the bad bytes where there are any."""
    head = "request body is not valid JSON"
    if isinstance(cause, UnicodeDecodeError):
        bad = cause.object[cause.start : cause.start + 1]
        return f"{head}: it is not UTF-8 (byte {bad!r} at position {cause.start})"
    if isinstance(cause, RecursionError):
        return f"{head}: it is nested deeper than the parser's limit (a few hundred levels)"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        # Python reads at most 4300 digits of an integer (a guard against quadratic time).
        return f"{head}: a number has more digits than the parser reads ({cause})".replace(
            "; use sys.set_int_max_str_digits() to increase the limit", ""
        )
    return f"{head} (it must be UTF-8 JSON nested at most a few hundred levels deep)"


def _allowed_methods(request: Request) -> list[str]:
    # Ask the router which methods would fully match this path (routers nest, so asking
    # each route for its own methods misses those of included routers).
    allowed = []
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
        scope = dict(request.scope) | {"method": method}
        if any(r.matches(scope)[0] == Match.FULL for r in request.app.router.routes):
            allowed.append(method)
    return allowed


def _routed(request: Request) -> bool:
    """Whether some route serves this path with some method (a 404 from a route, such as an
    unknown context, keeps the route's shape)."""
    # PARTIAL: the path matches and the method does not (that is a 405, not a 404).
    return any(r.matches(request.scope)[0] != Match.NONE for r in request.app.router.routes)


#: What a request that ran the server out of memory gets: the request is not wrong (its body
#: is within DPICL_MAX_BODY_BYTES), the server is short of memory now (other requests' bodies).
OUT_OF_MEMORY = (
    "the server ran out of memory while handling this request; nothing was charged, "
    "retry later (or send a smaller body)"
)


def out_of_memory() -> JSONResponse:
    return error_response(503, "server_busy", OUT_OF_MEMORY, headers={"Retry-After": "1"})


def retry_after_s(app: Any, exc: DpiclError) -> int | None:
    """When a retry of what ``exc`` refused may succeed, in whole seconds (``Retry-After``),
    or None (waiting cures nothing). The raiser's figure where it gave one; else, for a
    storage failure, the storage deadline (DPICL_DB_TIMEOUT_S: a locked or frozen database
    is given up on after it, so a retry sooner meets the same wait); for an engine failure,
    when the engine is expected back (:meth:`retry_after_s` of an engine that restarts: the
    backoff left plus the time a start takes) or 1 s."""
    if exc.retry_after_s is not None:
        return max(1, exc.retry_after_s)
    services = getattr(getattr(app, "state", None), "services", None)
    if isinstance(exc, StorageUnavailable):
        timeout = services.settings.db_timeout_s if services is not None else 5.0
        return max(1, math.ceil(timeout))
    if isinstance(exc, EngineError):
        hint = getattr(getattr(services, "engine", None), "retry_after_s", None)
        return max(1, math.ceil(hint())) if callable(hint) else 1
    return None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DpiclError)
    async def _dpicl(request: Request, exc: DpiclError) -> JSONResponse:
        headers: dict[str, str] | None = None
        if exc.status_code == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        retry = retry_after_s(request.app, exc)
        if retry is not None:
            headers = (headers or {}) | {"Retry-After": str(retry)}
        return error_response(
            exc.status_code, exc.code, exc.message, exc.param, headers, path=request.url.path
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation(exc, request.headers.get("content-type"), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, MemoryError):
            # FastAPI wraps whatever stops it reading the body in a 400; memory running out
            # while reading or parsing a valid body is the server's state, not bad JSON.
            return out_of_memory()
        if exc.status_code == 400 and isinstance(cause, DpiclError):
            # FastAPI turns whatever stops it reading the body into a 400: a chunked body
            # that BodyLimitMiddleware cut off at the limit is a 413, not "invalid JSON".
            return error_response(
                cause.status_code, cause.code, cause.message, cause.param, path=request.url.path
            )
        if exc.status_code == 400:
            # FastAPI's answer to a body json.loads could not read at all; the reason is
            # the exception it chained.
            return error_response(
                400, "invalid_json", _unreadable_json(cause), path=request.url.path
            )
        codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        path = request.url.path
        if exc.status_code == 404 and path.startswith("/v1/") and not _routed(request):
            # No route serves this path (an OpenAI route dpicl lacks: /v1/responses,
            # /v1/embeddings): OpenAI's shape, which holds the native fields too, so that an
            # OpenAI client reads why instead of failing on the body.
            why = (
                "the white-box routes /v1/debug/* exist only while DPICL_WHITEBOX is noisy "
                "or internal"
                if path.startswith("/v1/debug/")
                else "dpicl's OpenAI-compatible routes are /v1/models, /v1/chat/completions "
                "and /v1/completions"
            )
            return openai_error_response(
                404, "not_found", f"no route {request.method} {path} on this server ({why})"
            )
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette's Allow lists one route's methods; a path served by several routes
            # (GET and POST /v1/contexts) allows them all.
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return error_response(
            exc.status_code,
            codes.get(exc.status_code, "http_error"),
            str(exc.detail),
            headers=headers or None,
            path=request.url.path,
        )

    @app.exception_handler(MemoryError)
    async def _memory(_: Request, exc: MemoryError) -> JSONResponse:
        # Memory ran out outside the body's parsing (validation of a large body, the
        # engine): 503, and the process goes on (the request's objects are freed with it).
        log.warning("out of memory while handling a request (answered 503)")
        return out_of_memory()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The type only: an exception's text may quote private data (exemplars, queries).
        # Where it happened (file, line, code) is safe to log; the message is not.
        where = "".join(traceback.format_tb(exc.__traceback__))
        log.error("unhandled error %s at\n%s", type(exc).__name__, where)
        return error_response(500, "internal_error", "internal server error", path=request.url.path)


class BodyLimitMiddleware:
    """Refuse bodies over ``max_bytes`` with 413, by header and by counting the stream."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await self._reject(scope, receive, send, int(value))
                return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(
                        f"request body exceeds {limit} bytes (DPICL_MAX_BODY_BYTES)"
                    )
            return message

        await self.app(scope, counting_receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        response = error_response(
            413,
            PayloadTooLarge.code,
            f"request body of {size} bytes exceeds the limit of {self.max_bytes} bytes "
            "(DPICL_MAX_BODY_BYTES)",
            path=str(scope.get("path", "")),
        )
        await response(scope, receive, send)
