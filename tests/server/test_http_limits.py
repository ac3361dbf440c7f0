"""What a connection may cost before and while the app reads a request, over real sockets to
a real uvicorn (``tests.servers.ThreadServer``, ``dpicl serve``'s protocol and options):
a huge head is 431/414, a stalled head or body 408, a server at its connection limit 503,
each in the JSON error shape naming the setting, and HEAD answers on the health routes.

uvicorn's httptools protocol took a 200 MiB header and a URL as large, and waited forever
for a head or body sent a byte at a time."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from dpicl.config import Settings
from tests.servers import ADMIN, ThreadServer, oracle_server_env

#: Short limits, so each refusal comes at once (the defaults are 64 KiB, 10 s and 30 s).
LIMITS: dict[str, Any] = {
    "max_header_bytes": 8192,
    "max_header_count": 20,
    "header_timeout_s": 0.5,
    "body_timeout_s": 0.5,
}
#: How long a test waits for an answer; an unbounded server never gives one.
WAIT_S = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    db = tmp_path_factory.mktemp("limits") / "server.db"
    with ThreadServer(db, whitebox="off", **LIMITS) as srv:
        yield srv


def _connect(srv: ThreadServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT_S)


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one response (up to the connection's end)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed without an answer (got {data!r})")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def _error(body: bytes) -> dict[str, Any]:
    err: dict[str, Any] = json.loads(body)["error"]
    return err


def _send_all(sock: socket.socket, data: bytes) -> None:
    """Send as much of ``data`` as the server takes (it may close the connection first)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_head_within_the_limits_is_served(server: ThreadServer) -> None:
    with _connect(server) as sock:
        filler = b"X-Filler: " + b"a" * 4000 + b"\r\n"
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + filler + b"\r\n")
        status, _, _ = _read_response(sock)
    assert status == 200


def test_a_huge_header_field_is_431_naming_the_setting(server: ThreadServer) -> None:
    with _connect(server) as sock:
        _send_all(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        status, headers, body = _read_response(sock)
        assert status == 431, body
        assert headers["connection"] == "close"
        assert _closed(sock)
    err = _error(body)
    assert err["code"] == "headers_too_large"
    assert "8192 bytes" in err["message"] and "DPICL_MAX_HEADER_BYTES" in err["message"]
    assert "'X-Big'" in err["message"]


def test_an_endless_header_is_refused_before_it_grows(server: ThreadServer) -> None:
    """A header that never ends (200 MiB were taken in full): answered once the head passes
    the limit, by about one read of the socket, while the client is still sending."""
    with _connect(server) as sock:
        _send_all(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        sock.settimeout(0.05)
        while sent < 200 * 2**20:
            try:
                sock.sendall(b"a" * 16384)
                sent += 16384
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break
            try:
                peek = sock.recv(1, socket.MSG_PEEK)
            except TimeoutError:
                continue
            if peek:
                break
        sock.settimeout(WAIT_S)
        status, _, body = _read_response(sock)
    assert status == 431, body
    err = _error(body)
    got = int(re.search(r"got (\d+) bytes", err["message"]).group(1))  # type: ignore[union-attr]
    assert 8192 < got <= 8192 + 2**20, err["message"]
    assert sent < 64 * 2**20  # the server stopped it long before 200 MiB


def test_too_many_header_fields_is_431(server: ThreadServer) -> None:
    fields = b"".join(b"X-F%d: 1\r\n" % i for i in range(30))
    with _connect(server) as sock:
        _send_all(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        status, _, body = _read_response(sock)
    assert status == 431, body
    err = _error(body)
    assert "more than 20 header fields" in err["message"]
    assert "DPICL_MAX_HEADER_COUNT" in err["message"]


def test_a_huge_url_is_414(server: ThreadServer) -> None:
    with _connect(server) as sock:
        _send_all(sock, b"GET /healthz?" + b"q" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = _read_response(sock)
    assert status == 414, body
    err = _error(body)
    assert err["code"] == "uri_too_long"
    assert "8192 bytes" in err["message"] and "DPICL_MAX_HEADER_BYTES" in err["message"]


def test_a_stalled_head_is_408(server: ThreadServer) -> None:
    with _connect(server) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        status, headers, body = _read_response(sock)
        assert time.monotonic() - t0 < 5.0
        assert _closed(sock)
    assert status == 408, body
    assert headers["connection"] == "close"
    err = _error(body)
    assert err["code"] == "request_timeout"
    assert "0.5 s" in err["message"] and "DPICL_HEADER_TIMEOUT_S" in err["message"]


def test_a_head_trickled_byte_by_byte_is_408(server: ThreadServer) -> None:
    with _connect(server) as sock:
        t0 = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        sock.settimeout(0.1)
        while time.monotonic() - t0 < 5.0:
            _send_all(sock, b"X")  # a header name that never ends, one byte at a time
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break
            except TimeoutError:
                continue
        sock.settimeout(WAIT_S)
        status, _, body = _read_response(sock)
    assert status == 408, body
    assert time.monotonic() - t0 < 5.0


def test_a_silent_connection_is_closed(server: ThreadServer) -> None:
    with _connect(server) as sock:
        t0 = time.monotonic()
        assert _closed(sock)
        assert time.monotonic() - t0 < 5.0


def test_a_body_short_of_its_length_is_408(server: ThreadServer) -> None:
    """A client announcing 4000 bytes and trickling them (it held the request forever)."""
    head = (
        b"POST /v1/contexts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + ADMIN.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
    )
    with _connect(server) as sock:
        t0 = time.monotonic()
        sock.sendall(head + b'{"name": "')
        sock.settimeout(0.1)
        while time.monotonic() - t0 < 5.0:
            _send_all(sock, b"x")
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break
            except TimeoutError:
                continue
        sock.settimeout(WAIT_S)
        status, headers, body = _read_response(sock)
        assert time.monotonic() - t0 < 5.0
        assert headers["connection"] == "close"
        assert _closed(sock)
    assert status == 408, body
    err = _error(body)
    assert err["code"] == "request_timeout"
    assert "0.5 s" in err["message"] and "DPICL_BODY_TIMEOUT_S" in err["message"]
    # Nothing was stored.
    r = httpx.get(f"{server.url}/v1/contexts", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.json()["data"] == []


def test_a_body_in_pieces_within_the_deadline_is_read(server: ThreadServer) -> None:
    body = json.dumps({"name": "x"}).encode()
    head = (
        b"POST /v1/contexts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + ADMIN.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with _connect(server) as sock:
        sock.sendall(head + body[:5])
        time.sleep(0.1)
        sock.sendall(body[5:])
        status, _, answer = _read_response(sock)
    assert status == 422, answer  # read in full and validated (no exemplars), not 408


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz"])
def test_head_on_the_health_routes(server: ThreadServer, path: str) -> None:
    r = httpx.head(f"{server.url}{path}")
    assert r.status_code == 200, r.text
    assert r.content == b""
    assert r.headers["content-type"] == "application/json"


def test_a_server_at_its_connection_limit_answers_503(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With the caller's request id, an access-log line and its metrics, as any refusal."""
    caplog.set_level(logging.INFO)
    labels = {"route": "<unmatched>", "status": "503", "code": "server_busy"}
    before = _metric("dpicl_refusals_total", **labels)
    with ThreadServer(tmp_path / "busy.db", whitebox="off", max_connections=2) as srv:
        idle = [_connect(srv), _connect(srv)]
        time.sleep(0.2)  # accepted by the server
        with _connect(srv) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-ID: busy-1\r\n\r\n")
            status, headers, body = _read_response(sock)
        assert status == 503, body
        assert headers["retry-after"] == "1" and headers["x-request-id"] == "busy-1"
        access = [r for r in caplog.records if r.name == "dpicl.access"]
        assert any(
            getattr(r, "request_id", None) == "busy-1" and getattr(r, "status", None) == 503
            for r in access
        ), [r.__dict__ for r in access]
        assert _metric("dpicl_refusals_total", **labels) == before + 1
        err = _error(body)
        assert err["code"] == "server_busy"
        assert "2 connections" in err["message"] and "DPICL_MAX_CONNECTIONS" in err["message"]
        idle.pop().close()
        time.sleep(0.2)
        with _connect(srv) as sock:  # the second of two connections is served
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_response(sock)[0] == 200
        idle[0].close()


def test_dpicl_serve_bounds_the_head(start_server: Any, tmp_path: Path) -> None:
    """The command itself runs the limited protocol (not only the test servers)."""
    env = oracle_server_env(tmp_path, whitebox="off") | {"DPICL_MAX_HEADER_BYTES": "2048"}
    srv = start_server(env)
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT_S)
    with sock:
        _send_all(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
        status, _, body = _read_response(sock)
    assert status == 431, body
    assert "2048 bytes" in _error(body)["message"]


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("max_header_bytes", 1023),
        ("max_header_bytes", 16 * 2**20 + 1),
        ("max_header_count", 0),
        ("header_timeout_s", 0),
        ("header_timeout_s", float("nan")),
        ("body_timeout_s", -1),
        ("body_timeout_s", 3601),
        ("max_connections", 0),
    ],
)
def test_the_limits_settings_are_bounded(name: str, bad: object) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(**{name: bad})  # type: ignore[arg-type]
    assert info.value.errors()[0]["loc"] == (name,)


def test_the_limits_defaults() -> None:
    s = Settings()
    assert (s.max_header_bytes, s.max_header_count) == (64 * 1024, 100)
    assert (s.header_timeout_s, s.body_timeout_s, s.max_connections) == (10.0, 30.0, 512)


OOM_MARKER = b"OOM-IN-THE-PROTOCOL"


def _metric(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_memory_running_out_while_a_body_is_read_is_answered_like_any_503(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A MemoryError in the protocol layer while it buffers a body (issue 39): the app
    answers it, so it has ``Retry-After: 1``, the caller's ``X-Request-ID``, an access-log
    line and its metrics, and the log says what happened (not "a refused head")."""
    from dpicl.api.http_limits import LimitedHttpToolsProtocol

    real = LimitedHttpToolsProtocol.on_body

    def on_body(self: LimitedHttpToolsProtocol, body: bytes) -> None:
        if OOM_MARKER in body:
            raise MemoryError  # where buffering a body runs the heap out
        real(self, body)

    monkeypatch.setattr(LimitedHttpToolsProtocol, "on_body", on_body, raising=False)
    caplog.set_level(logging.INFO)
    labels = {"route": "/v1/classify", "status": "503", "code": "server_busy"}
    before = _metric("dpicl_refusals_total", **labels)
    body = b'{"context_id": "ctx_' + b"0" * 24 + b'", "query": "' + OOM_MARKER + b'"}'
    with _connect(server) as sock:
        head = (
            b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + ADMIN.encode() + b"\r\nX-Request-ID: oom-body-1\r\n"
            b"Content-Length: " + str(len(body) + 1000).encode() + b"\r\n\r\n"
        )
        sock.sendall(head + body)  # 1,000 bytes of it never come: they are not waited for
        status, headers, raw = _read_response(sock)
        assert _closed(sock)
    assert status == 503 and _error(raw)["code"] == "server_busy", raw
    assert "memory" in _error(raw)["message"]
    assert headers["retry-after"] == "1" and headers["x-request-id"] == "oom-body-1"
    access = [r for r in caplog.records if r.name == "dpicl.access"]
    assert any(
        getattr(r, "request_id", None) == "oom-body-1" and getattr(r, "status", None) == 503
        for r in access
    ), [r.__dict__ for r in access]
    said = [r.getMessage() for r in caplog.records if "memory" in r.getMessage()]
    assert said and not any("head" in m for m in said), said
    assert _metric("dpicl_refusals_total", **labels) == before + 1
    with _connect(server) as sock:  # and the server goes on
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock)[0] == 200


def test_memory_running_out_in_a_head_is_503_with_retry_after_and_request_id(
    server: ThreadServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dpicl.api.http_limits import LimitedHttpToolsProtocol

    real = LimitedHttpToolsProtocol.on_header

    def on_header(self: LimitedHttpToolsProtocol, name: bytes, value: bytes) -> None:
        if OOM_MARKER in value:
            raise MemoryError
        real(self, name, value)

    monkeypatch.setattr(LimitedHttpToolsProtocol, "on_header", on_header)
    caplog.set_level(logging.INFO)
    labels = {"route": "<unmatched>", "status": "503", "code": "server_busy"}
    before = _metric("dpicl_refusals_total", **labels)
    with _connect(server) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-ID: oom-head-1\r\n"
            b"X-Big: " + OOM_MARKER + b"\r\nX-After: 1\r\n\r\n"
        )
        status, headers, raw = _read_response(sock)
    assert status == 503 and _error(raw)["code"] == "server_busy", raw
    assert headers["retry-after"] == "1" and headers["x-request-id"] == "oom-head-1"
    access = [r for r in caplog.records if r.name == "dpicl.access"]
    assert any(getattr(r, "request_id", None) == "oom-head-1" for r in access)
    assert _metric("dpicl_refusals_total", **labels) == before + 1
