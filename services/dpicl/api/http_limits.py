"""uvicorn's httptools protocol with bounds on what a request's head may cost.

uvicorn's httptools protocol accepts a head of any size (it buffered a 200 MiB header and a
URL as large) and waits forever for a head sent a byte at a time. ``LimitedHttpToolsProtocol``
counts the head's bytes and fields as they are parsed and answers ``414 uri_too_long`` or
``431 headers_too_large`` (too large, ``DPICL_MAX_HEADER_BYTES``/``DPICL_MAX_HEADER_COUNT``)
or ``408 request_timeout`` (too slow, ``DPICL_HEADER_TIMEOUT_S``) in the project's JSON error
shape, then closes the connection: the rest of the request is unread, so the connection
cannot carry another one. Where uvicorn's ``limit_concurrency`` answers a plain-text 503,
this answers ``503 server_busy`` in the same shape (``DPICL_MAX_CONNECTIONS``).

The body is the app's to bound (``BodyLimitMiddleware``, ``BodyTimeoutMiddleware``): it is
read only when the app asks for it. ``uvicorn_options(settings)`` is what every server of
this project passes to uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from dpicl.api.access_log import UNMATCHED, count_refusal, valid_request_id
from dpicl.api.errors import OUT_OF_MEMORY, error_response
from dpicl.errors import DpiclError, HeadersTooLarge, RequestTimeout, ServerBusy, UriTooLong
from dpicl.metrics import REQUESTS

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from dpicl.config import Settings

log = logging.getLogger("dpicl.api")

#: How long a refused connection stays open to let the client read the refusal.
_LINGER_S = 2.0

#: Each header field costs its name, its value, ": " and CRLF.
_FIELD_OVERHEAD = 4


@dataclass(frozen=True)
class HttpLimits:
    """The head's limits (their settings are named in every refusal)."""

    max_header_bytes: int
    max_header_count: int
    header_timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpLimits:
        return cls(settings.max_header_bytes, settings.max_header_count, settings.header_timeout_s)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments for ``uvicorn.run``/``uvicorn.Config`` that bound a request's
    head and the number of connections (the app bounds the body)."""
    return {
        "http": protocol_class(HttpLimits.from_settings(settings)),
        "limit_concurrency": settings.max_connections,
        # Never chosen here (http= names the class above); should h11 ever be, it keeps the
        # same bound on a head (h11's own default is 16 KiB).
        "h11_max_incomplete_event_size": settings.max_header_bytes,
    }


def protocol_class(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """``LimitedHttpToolsProtocol`` bound to ``limits`` (uvicorn builds protocols from a class
    and its own config, so the limits travel as a class attribute)."""

    class Bound(LimitedHttpToolsProtocol):
        pass

    Bound.limits = limits
    return Bound


class _HeadRefused(Exception):
    """Raised from a parser callback to stop parsing; httptools chains it as the context of
    the ``HttpParserCallbackError`` that ``feed_data`` raises."""

    def __init__(self, error: DpiclError) -> None:
        super().__init__(error.message)
        self.error = error


class _UnreadableBody(bytearray):
    """What a request's body buffer becomes when memory ran out while it was read: the
    application's next read of the body (uvicorn's ``receive``, which copies the buffer
    with ``bytes()``) raises ``MemoryError``, which the application answers like any other
    (503 ``server_busy``, ``Retry-After: 1``, the request's id, its access-log line and its
    metrics: api/errors.py, api/access_log.py). The bytes of the body that did arrive are
    dropped with it."""

    def __bytes__(self) -> bytes:
        raise MemoryError


class _LingeringTransport:
    """The transport of a request whose body is left unread, as uvicorn's cycle sees it:
    closing it ends the answer and closes a little later (see ``_refuse``), so that the
    client still sending its body reads the answer instead of a reset."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        _linger_close(self._transport, self._loop)


def _linger_close(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
    # A lingering close: closing with the client's unread bytes in the socket sends a
    # reset, which can destroy the answer before the client reads it (a client still
    # sending a huge head sees "connection reset" instead of 431). So end the answer,
    # discard what still arrives (data_received ignores it), and close a little later.
    if transport.is_closing():
        return
    if not transport.can_write_eof():
        transport.close()
        return
    transport.write_eof()
    loop.call_later(_LINGER_S, transport.close)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` refusing a head over ``limits`` (see the module's docstring)."""

    limits: ClassVar[HttpLimits]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn's own check answers in plain text; on_headers_complete answers in JSON.
        self.max_connections = self.limit_concurrency
        self.limit_concurrency = None
        self.in_head = False  # between a message's first byte and the end of its head
        self.head_bytes = 0  # the URL and header fields parsed so far
        self.head_raw_bytes = 0  # bytes of the chunks that lay wholly inside the head
        self.header_count = 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.refused = False

    # Connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a client that connects and sends nothing

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, but a callback's refusal is answered as such (uvicorn
        # answers every parser error with a plain-text 400).
        if self.refused:
            return
        self._unset_keepalive_if_required()
        if not self._request_running():
            self._arm_head_timer()  # the next head, on a kept-alive connection
        was_in_head = self.in_head
        try:
            self.parser.feed_data(data)
        except MemoryError:
            self._out_of_memory()
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadRefused):
                self._refuse(exc.__context__.error)
                return
            if isinstance(exc.__context__, MemoryError):
                # Buffering a valid body ran the process out of memory: the server's state,
                # not a bad request (uvicorn would answer 400 "Invalid HTTP request").
                self._out_of_memory()
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if was_in_head and self.in_head:
            # httptools buffers a header field until the next one starts, so the callbacks
            # alone never see one huge field: count the raw bytes of every chunk that lay
            # wholly inside the head (the first chunk is bounded by the transport's reads).
            self.head_raw_bytes += len(data)
            if self.head_raw_bytes > self.limits.max_header_bytes:
                self._refuse(self._too_large(self.head_raw_bytes))

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_head = True
        self.head_bytes = self.head_raw_bytes = self.header_count = 0

    def on_url(self, url: bytes) -> None:
        self.head_bytes += len(url)
        size = len(self.url) + len(url)
        if size > self.limits.max_header_bytes:
            raise _HeadRefused(
                UriTooLong(
                    f"the request URL is longer than {self.limits.max_header_bytes} bytes "
                    f"(got {size} bytes and more; DPICL_MAX_HEADER_BYTES)"
                )
            )
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        self.head_bytes += len(name) + len(value) + _FIELD_OVERHEAD
        if self.header_count > self.limits.max_header_count:
            raise _HeadRefused(
                HeadersTooLarge(
                    f"the request has more than {self.limits.max_header_count} header fields "
                    "(DPICL_MAX_HEADER_COUNT)"
                )
            )
        if self.head_bytes > self.limits.max_header_bytes:
            raise _HeadRefused(self._too_large(self.head_bytes, name))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self._cancel_head_timer()
        limit = self.max_connections
        # This connection is among self.connections, this request not yet among self.tasks:
        # at most `limit` of each. (uvicorn's own test, `>= limit` for both, served one
        # connection fewer than its limit.)
        if limit is None or (len(self.connections) <= limit and len(self.tasks) < limit):
            super().on_headers_complete()
            return
        # Answered as the head's refusals are: the caller's X-Request-ID, an access-log
        # line and the metrics (the app, whose middleware would, is not reached).
        rid = self._request_id()
        error = ServerBusy(
            f"the server holds its limit of {limit} connections (DPICL_MAX_CONNECTIONS); "
            "retry shortly"
        )
        log.warning("refused a request: %s", error.message, extra={"request_id": rid})
        app = self.app
        self.app = _busy_app(error, rid)
        try:
            super().on_headers_complete()
        finally:
            self.app = app
        self._log_refusal(error, rid)

    # Refusals

    def _too_large(self, size: int, name: bytes | None = None) -> HeadersTooLarge:
        at = ""
        if name is not None:
            shown = name[:64].decode("latin-1")
            at = f" at header field {shown!r}" + ("..." if len(name) > 64 else "")
        return HeadersTooLarge(
            f"the request's header fields exceed {self.limits.max_header_bytes} bytes "
            f"(got {size} bytes{at} and maybe more; DPICL_MAX_HEADER_BYTES)"
        )

    def _out_of_memory(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:
                self.transport.close()  # a second response cannot follow the first
                return
            # A request whose body was being read: the application answers it, as any
            # other (see _UnreadableBody), and the connection closes after that answer (the
            # rest of the body is unread; data_received drops what still arrives).
            log.warning("out of memory while reading a request body (answered 503 server_busy)")
            self.refused = True
            cycle.keep_alive = False
            cycle.body = _UnreadableBody()
            cycle.more_body = False
            cycle.transport = _LingeringTransport(self.transport, self.loop)  # type: ignore[assignment]
            cycle.message_event.set()
            return
        self._refuse(ServerBusy(OUT_OF_MEMORY), retry_after=True)

    def _request_id(self) -> str:
        """The request id of a refusal answered here: the caller's ``X-Request-ID`` when
        its head was parsed that far and the id is valid (api/access_log.py), else a new
        one."""
        for name, value in getattr(self, "headers", None) or ():
            if name == b"x-request-id":
                given = str(value.decode("latin-1"))
                if valid_request_id(given):
                    return given
        return secrets.token_hex(8)

    def _refuse(self, error: DpiclError, *, retry_after: bool = False) -> None:
        """Answer ``error`` in the JSON error shape and close the connection (the rest of the
        request is unread). A response still being computed for an earlier pipelined
        request on this connection is lost, as with uvicorn's own 400. Like an answer of
        the application, it carries ``X-Request-ID``, writes an access-log line and is
        counted in the metrics (under the route ``<unmatched>``: no route was reached)."""
        self.refused = True
        self._cancel_head_timer()
        rid = self._request_id()
        what = "request head" if self.in_head or self.cycle is None else "request"
        log.warning("refused a %s: %s", what, error.message, extra={"request_id": rid})
        # The app's own error shape and rendering (dpicl.api.errors.error_response).
        body = bytes(error_response(error.status_code, error.code, error.message, error.param).body)
        content = [STATUS_LINE[error.status_code]]
        for name, value in self.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        if retry_after:
            content.append(b"retry-after: 1\r\n")
        content += [
            b"x-request-id: " + rid.encode("ascii") + b"\r\n",
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n",
            b"\r\n",
            body,
        ]
        self.transport.write(b"".join(content))
        self._log_refusal(error, rid)
        _linger_close(self.transport, self.loop)

    def _log_refusal(self, error: DpiclError, rid: str) -> None:
        """The access-log line and the request metrics of a refusal answered here."""
        try:
            method = self.parser.get_method().decode("ascii", "replace")
        except Exception:  # the head ended before its method was parsed
            method = "?"
        status = error.status_code
        REQUESTS.labels(method, UNMATCHED, str(status)).inc()
        count_refusal(UNMATCHED, status, [error.code])
        logging.getLogger("dpicl.access").info(
            "%s %s %d (refused by the HTTP protocol layer)",
            method,
            UNMATCHED,
            status,
            extra={
                "request_id": rid,
                "method": method,
                "route": UNMATCHED,
                "status": status,
                "latency_ms": None,
                "key_id": None,
            },
        )

    # The head's deadline

    def _request_running(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        if self.head_timer is None:
            self.head_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._head_timed_out
            )

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if self._request_running():
            if self.in_head:
                # A pipelined head behind a response still being computed: that response
                # must not be cut off, so the next head's clock restarts after it.
                self._arm_head_timer()
            return  # a body: BodyTimeoutMiddleware's
        if self.in_head:
            self._refuse(
                RequestTimeout(
                    f"the request head did not arrive within {self.limits.header_timeout_s} s "
                    "(DPICL_HEADER_TIMEOUT_S)"
                )
            )
        else:
            # No request began (a silent connection, or bytes outside any request): there
            # is nobody to answer.
            self.transport.close()


def _busy_app(error: ServerBusy, rid: str) -> Any:
    async def busy(scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            error.status_code,
            error.code,
            error.message,
            headers={"Connection": "close", "Retry-After": "1", "X-Request-ID": rid},
        )
        await response(scope, receive, send)

    return busy
