"""DpiclClient unit tests over httpx.MockTransport: retries, backoff, error mapping, auth."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from dpicl_audit.client import AuditTarget, DpiclClient
from dpicl_audit.errors import (
    AuditError,
    TargetBudgetExhausted,
    TargetNotFound,
    TargetProtocolError,
    TargetRejected,
    TargetUnauthorized,
    TargetUnavailable,
)
from dpicl_audit.mechanisms.base import TrialAt
from dpicl_audit.mechanisms.voting.audit import white_box_votes
from dpicl_audit.store import ContextRecord

Handler = Callable[[httpx.Request], httpx.Response]


def _client(handler: Handler, **kw: object) -> tuple[DpiclClient, list[float]]:
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        sleeps.append(s)

    params: dict[str, object] = {
        "admin_token": "adm",
        "api_key": "usr",
        "retries": 3,
        "backoff": 0.1,
        "sleep": fake_sleep,
    } | kw
    client = DpiclClient(
        "http://srv.test/",
        transport=httpx.MockTransport(handler),
        **params,  # type: ignore[arg-type]
    )
    return client, sleeps


def _error(status: int, code: str, message: str, param: str | None = None) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": code, "message": message, "param": param}}
    )


async def test_client_satisfies_the_protocol() -> None:
    client, _ = _client(lambda r: httpx.Response(200, json={}))
    assert isinstance(client, AuditTarget)
    await client.aclose()


async def test_auth_headers_and_paths() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.method, req.url.path, req.headers.get("authorization")))
        if req.url.path == "/v1/classify":
            return httpx.Response(200, json={"label": "Yes"})
        if req.url.path == "/v1/debug/classify":
            return httpx.Response(200, json={"label": "No", "noisy_votes": {}, "sigma": 1.0})
        if req.method == "DELETE":
            return httpx.Response(204)
        if req.url.path == "/v1/contexts" and req.method == "GET":
            return httpx.Response(200, json={"data": [{"id": "ctx_1"}]})
        if req.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(201, json={"id": "ctx_1", "mechanism": {"sigma": 2.0}})

    async with _client(handler)[0] as client:
        assert (await client.create_context({"x": 1}))["id"] == "ctx_1"
        await client.get_context("ctx_1")
        assert await client.list_contexts() == [{"id": "ctx_1"}]
        assert (await client.classify("ctx_1", "q"))["label"] == "Yes"
        assert (await client.debug_classify("ctx_1", "q"))["label"] == "No"
        await client.delete_context("ctx_1")
        assert (await client.health())["status"] == "ok"
    assert seen == [
        ("POST", "/v1/contexts", "Bearer adm"),
        ("GET", "/v1/contexts/ctx_1", "Bearer adm"),
        ("GET", "/v1/contexts", "Bearer adm"),
        ("POST", "/v1/classify", "Bearer usr"),
        ("POST", "/v1/debug/classify", "Bearer adm"),
        ("DELETE", "/v1/contexts/ctx_1", "Bearer adm"),
        ("GET", "/healthz", None),
    ]


async def test_list_contexts_follows_the_cursor() -> None:
    """The server answers one page per request: the client asks for every page."""
    pages = {
        None: {"data": [{"id": "ctx_1"}, {"id": "ctx_2"}], "next": "c2"},
        "c2": {"data": [{"id": "ctx_3"}], "next": "c3"},
        "c3": {"data": [], "next": None},
    }
    asked: list[tuple[str | None, str | None]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        cursor = req.url.params.get("cursor")
        asked.append((cursor, req.url.params.get("limit")))
        return httpx.Response(200, json=pages[cursor])

    async with _client(handler)[0] as client:
        got = await client.list_contexts()
    assert [c["id"] for c in got] == ["ctx_1", "ctx_2", "ctx_3"]
    assert asked == [(None, "100"), ("c2", "100"), ("c3", "100")]


async def test_list_contexts_refuses_a_cursor_that_goes_round() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"id": "ctx_1"}], "next": "same"})

    async with _client(handler)[0] as client:
        with pytest.raises(TargetProtocolError, match="repeated 'next' cursor 'same'"):
            await client.list_contexts()


async def test_api_key_defaults_to_admin_token() -> None:
    auth: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        auth.append(req.headers.get("authorization"))
        return httpx.Response(200, json={"label": "Yes"})

    client, _ = _client(handler, api_key=None)
    await client.classify("c", "q")
    await client.aclose()
    assert auth == ["Bearer adm"]


async def test_retries_5xx_then_succeeds_with_exponential_backoff() -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            return httpx.Response(503, json={"error": {"code": "engine_unavailable"}})
        return httpx.Response(200, json={"label": "Yes"})

    client, sleeps = _client(handler)
    out = await client.classify("c", "q")
    await client.aclose()
    assert out["label"] == "Yes" and calls == 3
    assert len(sleeps) == 2
    # jittered exponential backoff: attempt k waits in [b 2^k / 2, b 2^k]
    assert 0.05 <= sleeps[0] <= 0.1 and 0.1 <= sleeps[1] <= 0.2
    assert client.retried == 2


async def test_retries_connection_errors_and_gives_up() -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("connection refused", request=req)

    client, sleeps = _client(handler, retries=2)
    with pytest.raises(TargetUnavailable, match="after 3 attempts") as info:
        await client.classify("c", "q")
    await client.aclose()
    assert calls == 3 and len(sleeps) == 2
    assert info.value.status is None and info.value.attempts == 3


async def test_retries_timeouts() -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ReadTimeout("slow", request=req)
        return httpx.Response(200, json={"label": "No"})

    client, _ = _client(handler)
    assert (await client.classify("c", "q"))["label"] == "No"
    await client.aclose()


async def test_persistent_5xx_reports_last_status() -> None:
    client, _ = _client(lambda r: httpx.Response(500, text="boom"), retries=1)
    with pytest.raises(TargetUnavailable) as info:
        await client.get_context("c")
    await client.aclose()
    assert info.value.status == 500 and "boom" in str(info.value)


UNAUTHORIZED = _error(401, "unauthorized", "missing bearer token")
NOT_FOUND = _error(404, "not_found", "no context with id 'x'", "context_id")
BUDGET = _error(402, "budget_exhausted", "spent")
BUDGET_LEGACY = _error(403, "budget_exhausted", "spent")  # servers before issue 39
INVALID = _error(422, "invalid_request", "epsilon must be > 0", "mechanism.epsilon")
TOO_LARGE = _error(413, "payload_too_large", "too big")


@pytest.mark.parametrize(
    ("response", "exc_type", "code"),
    [
        (UNAUTHORIZED, TargetUnauthorized, "unauthorized"),
        (NOT_FOUND, TargetNotFound, "not_found"),
        (BUDGET, TargetBudgetExhausted, "budget_exhausted"),
        (BUDGET_LEGACY, TargetBudgetExhausted, "budget_exhausted"),
        (INVALID, TargetRejected, "invalid_request"),
        (TOO_LARGE, TargetRejected, "payload_too_large"),
        (httpx.Response(404, json={"detail": "Not Found"}), TargetNotFound, "http_error"),
        (httpx.Response(400, text="plain"), TargetRejected, "http_error"),
    ],
)
async def test_4xx_is_not_retried_and_carries_the_servers_error(
    response: httpx.Response, exc_type: type[TargetRejected], code: str
) -> None:
    calls = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return response

    client, sleeps = _client(handler)
    with pytest.raises(exc_type) as info:
        await client.create_context({})
    await client.aclose()
    assert calls == 1 and sleeps == []
    err = info.value
    assert err.status == response.status_code and err.code == code
    assert isinstance(err, AuditError)
    assert err.path == "/v1/contexts"
    if code == "invalid_request":
        assert err.param == "mechanism.epsilon" and "epsilon must be > 0" in str(err)


async def test_protocol_errors() -> None:
    client, _ = _client(lambda r: httpx.Response(200, text="not json"))
    with pytest.raises(TargetProtocolError, match="not JSON"):
        await client.classify("c", "q")
    await client.aclose()
    client, _ = _client(lambda r: httpx.Response(200, json={"noisy_votes": {}}))
    with pytest.raises(TargetProtocolError, match="without label"):
        await client.debug_classify("c", "q")
    await client.aclose()
    # What else a debug answer holds is its mechanism's audit's to require (voting's votes).
    at = TrialAt("eps=1", 1.0, 0, 1, ContextRecord("eps=1", 1, 1.0, "c", {}), white=True)
    with pytest.raises(TargetProtocolError, match="without noisy_votes, sigma"):
        white_box_votes({"label": "Yes"}, at)
    client, _ = _client(lambda r: httpx.Response(200, json=[1]))
    with pytest.raises(TargetProtocolError, match="not an object"):
        await client.health()
    await client.aclose()


async def test_bounded_concurrency() -> None:
    active = 0
    peak = 0

    async def handler(req: httpx.Request) -> httpx.Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        return httpx.Response(200, json={"label": "Yes"})

    client = DpiclClient(
        "http://srv.test", admin_token="a", concurrency=3, transport=httpx.MockTransport(handler)
    )
    await asyncio.gather(*(client.classify("c", str(i)) for i in range(20)))
    await client.aclose()
    assert peak == 3
    assert client.requests_sent == 20


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        DpiclClient("http://x", concurrency=0)
    with pytest.raises(ValueError, match="retries"):
        DpiclClient("http://x", retries=-1)
