"""The auditor's HTTP client for a dpicl server (HTTP API v1, docs/architecture.md).

:class:`DpiclClient` is an async httpx client with bounded concurrency (a semaphore around
every request), per-request timeouts, and retries with exponential backoff and jitter on
connection errors, timeouts and 5xx answers. 4xx answers are never retried: they raise a
:class:`~dpicl_audit.errors.TargetRejected` subclass carrying the server's ``code``,
``message`` and ``param``.

The runner depends only on the :class:`AuditTarget` protocol, so tests can hand it a client
over ``httpx.MockTransport`` or ``httpx.ASGITransport`` (``transport=``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Self
from urllib.parse import urlencode

import httpx

from dpicl_audit.client.target import AuditTarget, ContextBody, GenerationTarget
from dpicl_audit.context_info import ContextInfo, context_info
from dpicl_audit.errors import (
    TargetBudgetExhausted,
    TargetNotFound,
    TargetProtocolError,
    TargetRejected,
    TargetUnauthorized,
    TargetUnavailable,
)
from dpicl_audit.jsontypes import JsonMapping, JsonObject

__all__ = [
    "AuditTarget",
    "ContextBody",
    "DpiclClient",
    "GenerationTarget",
    "error_from_response",
]

#: Contexts per page of GET /v1/contexts (the server's largest page is 200).
LIST_PAGE_SIZE = 100


_REJECTIONS: dict[int, type[TargetRejected]] = {
    401: TargetUnauthorized,
    403: TargetBudgetExhausted,
    404: TargetNotFound,
}


def error_from_response(response: httpx.Response, path: str = "") -> TargetRejected:
    """The exception for a 4xx answer, from the API's single error shape when present."""
    code, message, param = "http_error", response.reason_phrase or "error", None
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = payload["error"]
        code = str(err.get("code") or code)
        message = str(err.get("message") or message)
        param = err.get("param")
        param = None if param is None else str(param)
    elif isinstance(payload, dict) and "detail" in payload:  # a framework default shape
        message = str(payload["detail"])
    elif response.text:
        message = response.text[:500]
    if response.status_code == 404 and path.startswith("/v1/debug/") and param is None:
        # The server registers /v1/debug/* only with white-box access on: a 404 for the
        # route itself (an unknown context has param context_id) means that it is off.
        message += (
            " (the server's white-box endpoints are off: a white-box audit needs it started "
            "with DPICL_WHITEBOX=noisy, or internal for clean internals)"
        )
    cls = _REJECTIONS.get(response.status_code, TargetRejected)
    if response.status_code == 403 and code != "budget_exhausted":
        cls = TargetRejected
    if response.status_code in (402, 403, 429) and code == "budget_exhausted":
        # 402 on both surfaces; servers before issue 39 answered 403 (native) and 429
        # (OpenAI surface), and the auditor still audits them.
        cls = TargetBudgetExhausted
    return cls(response.status_code, code, message, param, path=path)


class DpiclClient:
    """An async client for one dpicl server.

    ``admin_token`` authorises context management and ``/v1/debug/*``; ``api_key`` is used
    for ``/v1/classify`` (the admin token when it is None). Use as an async context manager
    or call :meth:`aclose`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        admin_token: str | None = None,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self._admin = admin_token
        self._key = api_key or admin_token
        self._retries = retries
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._sleep = sleep
        self._sem = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            limits=limits,
            transport=transport,
            headers={"User-Agent": "dpicl-audit"},
        )
        self.requests_sent = 0
        self.retried = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ----------------------------------------------------------------- transport

    def _delay(self, attempt: int) -> float:
        base: float = min(self._max_backoff, self._backoff * (2.0**attempt))
        return base * (0.5 + random.random() / 2.0)  # jitter: spread retries of many workers

    async def request(
        self, method: str, path: str, *, token: str | None, json: Mapping[str, object] | None = None
    ) -> httpx.Response:
        """One request with retries; returns a 2xx response or raises a TargetError."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        last_status: int | None = None
        last_error = ""
        for attempt in range(self._retries + 1):
            if attempt:
                self.retried += 1
                await self._sleep(self._delay(attempt - 1))
            try:
                async with self._sem:
                    self.requests_sent += 1
                    response = await self._http.request(method, path, json=json, headers=headers)
            except httpx.TransportError as exc:  # connect errors, timeouts, broken streams
                last_status, last_error = None, f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500:
                last_status = response.status_code
                last_error = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                raise error_from_response(response, path)
            return response
        raise TargetUnavailable(
            f"{method} {self.base_url}{path} failed after {self._retries + 1} attempts: "
            f"{last_error}",
            status=last_status,
            attempts=self._retries + 1,
        )

    async def _json(
        self, method: str, path: str, *, token: str | None, json: Mapping[str, object] | None = None
    ) -> JsonObject:
        response = await self.request(method, path, token=token, json=json)
        try:
            payload = response.json()
        except ValueError as exc:
            raise TargetProtocolError(
                f"{method} {path} answered {response.status_code} with a body that is not JSON"
            ) from exc
        if not isinstance(payload, dict):
            raise TargetProtocolError(f"{method} {path} answered JSON that is not an object")
        return payload

    # ----------------------------------------------------------------- API v1

    async def health(self) -> JsonObject:
        return await self._json("GET", "/healthz", token=None)

    async def create_context(self, body: ContextBody) -> ContextInfo:
        info = await self._json("POST", "/v1/contexts", token=self._admin, json=body)
        _require(info, ("id", "mechanism"), "POST /v1/contexts")
        return context_info(info)

    async def get_context(self, context_id: str) -> ContextInfo:
        info = await self._json("GET", f"/v1/contexts/{context_id}", token=self._admin)
        _require(info, ("id", "mechanism"), "GET /v1/contexts/{id}")
        return context_info(info)

    async def burst(
        self, path: str, bodies: Sequence[JsonMapping]
    ) -> list[httpx.Response | Exception]:
        """``POST path`` once per body, all at once with the user key: no retries (a retry
        would send a request twice) and not held back by the client's concurrency, so that
        every request is in flight together (the ledger audited under concurrency,
        :mod:`dpicl_audit.probes.ledger_burst`). Each response, or the transport error."""
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}

        async def one(body: JsonMapping) -> httpx.Response:
            self.requests_sent += 1
            return await self._http.request("POST", path, json=body, headers=headers)

        out = await asyncio.gather(*(one(b) for b in bodies), return_exceptions=True)
        return [r if isinstance(r, httpx.Response | Exception) else Exception(r) for r in out]

    async def send(
        self,
        path: str,
        body: JsonMapping | None,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """``POST path`` (``GET`` where ``body`` is None) with the user key, once (no retry: it
        would spend twice), within the client's concurrency; the response whatever its
        status, for a caller that reads it whole (headers, stream:
        :mod:`dpicl_audit.probes.surface`). ``params`` and ``headers``: a query string and
        headers besides the key's (:mod:`dpicl_audit.probes.switches`). A transport failure
        raises :class:`~dpicl_audit.errors.TargetUnavailable`."""
        sent = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        method = "GET" if body is None else "POST"
        try:
            async with self._sem:
                self.requests_sent += 1
                return await self._http.request(
                    method, path, json=body, params=params, headers={**(headers or {}), **sent}
                )
        except httpx.TransportError as exc:
            raise TargetUnavailable(
                f"{method} {self.base_url}{path} failed: {type(exc).__name__}: {exc}",
                status=None,
                attempts=1,
            ) from exc

    async def send_streamed(
        self, path: str, body: JsonMapping, started: Callable[[str], bool]
    ) -> tuple[httpx.Response, float | None]:
        """:meth:`send` with the body read as it arrives: the response (read whole) and the
        seconds from sending until ``started(text so far)`` first held (a stream's first
        token, the caller says how it looks: not its first byte, which a server may send
        before it answers), None where it never did."""
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        try:
            async with self._sem:
                self.requests_sent += 1
                t0 = asyncio.get_running_loop().time()
                first: float | None = None
                parts: list[bytes] = []
                async with self._http.stream("POST", path, json=body, headers=headers) as got:
                    async for chunk in got.aiter_bytes():
                        parts.append(chunk)
                        if first is None and started(b"".join(parts).decode(errors="replace")):
                            first = asyncio.get_running_loop().time() - t0
                # The body as read (decoded: the encoding headers no longer describe it).
                kept = {
                    k: v
                    for k, v in got.headers.multi_items()
                    if k.lower() not in ("content-encoding", "content-length")
                }
                whole = httpx.Response(
                    got.status_code, headers=kept, content=b"".join(parts), request=got.request
                )
                return whole, first
        except httpx.TransportError as exc:
            raise TargetUnavailable(
                f"POST {self.base_url}{path} failed: {type(exc).__name__}: {exc}",
                status=None,
                attempts=1,
            ) from exc

    async def spend(self, context_id: str) -> JsonObject:
        """``GET /v1/contexts/{id}/spend`` (admin): the context's spend rows and totals."""
        return await self._json("GET", f"/v1/contexts/{context_id}/spend", token=self._admin)

    async def post(self, path: str, body: JsonMapping) -> JsonObject:
        """``POST path`` with the user key (a route the client has no method for, e.g. a chat
        completion with client parameters: :mod:`dpicl_audit.probes.parameters`)."""
        return await self._json("POST", path, token=self._key, json=body)

    async def get_model(self, model_id: str) -> JsonObject:
        """``GET /v1/models/{id}`` (the OpenAI surface's model: dpicl's extension carries the
        deployment's epsilon and delta), with the user key."""
        return await self._json("GET", f"/v1/models/{model_id}", token=self._key)

    async def list_contexts(self) -> list[JsonObject]:
        """Every context, following the listing's ``next`` cursor page after page (a server
        answers at most one page per request)."""
        out: list[JsonObject] = []
        seen: set[str] = set()
        path = f"/v1/contexts?limit={LIST_PAGE_SIZE}"
        while True:
            payload = await self._json("GET", path, token=self._admin)
            data = payload.get("data")
            if not isinstance(data, list):
                raise TargetProtocolError("GET /v1/contexts answered without a 'data' list")
            out += [d for d in data if isinstance(d, dict)]
            cursor = payload.get("next")
            if cursor is None:  # the last page (or a server that does not paginate)
                return out
            if not isinstance(cursor, str) or cursor in seen:
                # A cursor seen before would list the same page forever.
                raise TargetProtocolError(
                    f"GET /v1/contexts answered a bad or repeated 'next' cursor {cursor!r}"
                )
            seen.add(cursor)
            path = "/v1/contexts?" + urlencode({"limit": LIST_PAGE_SIZE, "cursor": cursor})

    async def delete_context(self, context_id: str) -> None:
        await self.request("DELETE", f"/v1/contexts/{context_id}", token=self._admin)

    async def classify(self, context_id: str, query: str) -> JsonObject:
        body = {"context_id": context_id, "query": query}
        out = await self._json("POST", "/v1/classify", token=self._key, json=body)
        _require(out, ("label",), "POST /v1/classify")
        return out

    async def debug_classify(self, context_id: str, query: str) -> JsonObject:
        body = {"context_id": context_id, "query": query}
        out = await self._json("POST", "/v1/debug/classify", token=self._admin, json=body)
        # The answer only: what else a mechanism's debug view holds (voting's noisy votes,
        # ESA's noisy mean) is its audit's to require (mechanisms.base.require_keys).
        _require(out, ("label",), "POST /v1/debug/classify")
        return out

    async def generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JsonObject:
        body: JsonObject = {"context_id": context_id, "query": query}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        out = await self._json("POST", "/v1/generate", token=self._key, json=body)
        _require(out, ("text",), "POST /v1/generate")
        return out

    async def debug_generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JsonObject:
        body: JsonObject = {"context_id": context_id, "query": query}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        out = await self._json("POST", "/v1/debug/generate", token=self._admin, json=body)
        _require(out, ("text",), "POST /v1/debug/generate")
        return out

    async def zero_shot(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JsonObject:
        """The context's template answered with no exemplar (``POST /v1/zero-shot``, admin):
        the zero-shot baseline of a utility audit; it costs no privacy."""
        body: JsonObject = {"context_id": context_id, "query": query}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        out = await self._json("POST", "/v1/zero-shot", token=self._admin, json=body)
        _require(out, ("task",), "POST /v1/zero-shot")
        return out


def _require(payload: JsonMapping, keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in payload]
    if missing:
        raise TargetProtocolError(f"{what} answered without {', '.join(missing)}")
