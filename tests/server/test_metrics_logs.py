"""Operations (issue 26): Prometheus metrics, request ids and the access log, in-process and in
a real ``dpicl serve`` process writing JSON logs; neither carries exemplars, queries or
tokens."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Request
from prometheus_client.parser import text_string_to_metric_families

from dpicl.api.access_log import valid_request_id
from dpicl.logging_setup import JsonFormatter, TextFormatter
from dpicl.store.keys import static_key_id
from tests.conftest import ADMIN, USER, admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.hostile_cases import SECRET

QUERY_SECRET = "QUERY-SECRET-91c2"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, keyed by name and sorted labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def secret_context(budget: dict[str, float] | None) -> dict[str, Any]:
    body = voting_context(budget=budget)
    body["exemplars"][0]["input"] = f"{SECRET} record"
    return body


def test_metrics_count_requests_by_route_template_refusals_and_budgets(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        assert c.get("/metrics").status_code == 401  # admin token by default
        before = c.get("/metrics", headers=admin_headers()).text
        r = c.post(
            "/v1/contexts",
            json=secret_context({"epsilon": 3.0, "delta": 1e-5}),
            headers=admin_headers(),
        )
        cid = r.json()["id"]
        for _ in range(2):
            q = {"context_id": cid, "query": QUERY_SECRET}
            assert c.post("/v1/classify", json=q, headers=user_headers()).status_code == 200
        c.get(f"/v1/contexts/{cid}", headers=admin_headers())
        c.get("/v1/contexts/ctx_000000000000000000000000", headers=admin_headers())
        c.post("/v1/classify", json={"context_id": cid}, headers=user_headers())  # 422
        after = c.get("/metrics", headers=admin_headers())
        # A deleted context's budget series go with it.
        assert c.delete(f"/v1/contexts/{cid}", headers=admin_headers()).status_code == 204
        gone = c.get("/metrics", headers=admin_headers()).text
        assert cid not in gone
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text

    def delta(name: str, **labels: str) -> float:
        return value(text, name, **labels) - value(before, name, **labels)

    route = "/v1/contexts/{context_id}"
    assert (
        delta("dpicl_http_requests_total", method="POST", route="/v1/classify", status="200") == 2
    )
    assert delta("dpicl_http_requests_total", method="GET", route=route, status="200") == 1
    assert delta("dpicl_http_requests_total", method="GET", route=route, status="404") == 1
    assert delta("dpicl_http_request_duration_seconds_count", method="POST", route="/v1/classify")
    assert delta("dpicl_refusals_total", route=route, status="404", code="not_found") == 1
    assert (
        delta("dpicl_refusals_total", route="/v1/classify", status="422", code="invalid_request")
        == 1
    )
    # Two answers of epsilon 1 each; the budget's composed spend and what is left.
    assert value(text, "dpicl_epsilon_charged_total", context_id=cid) == pytest.approx(2.0)
    spent = value(text, "dpicl_budget_epsilon_spent", context_id=cid)
    left = value(text, "dpicl_budget_epsilon_remaining", context_id=cid)
    assert 1.0 < spent <= 2.0 and left == pytest.approx(3.0 - spent)
    assert delta("dpicl_db_operation_duration_seconds_count", operation="charge") == 2
    # Routes are templates: no id, no query text, no exemplar anywhere in the exposition.
    routes = {dict(k[1]).get("route") for k in samples(text) if k[0].startswith("dpicl_http")}
    assert all(r is None or "ctx_" not in r for r in routes), routes
    for leaked in (SECRET, QUERY_SECRET, ADMIN, USER):
        assert leaked not in text


def test_metrics_setting_open_and_off(tmp_path: Path) -> None:
    with make_client(tmp_path / "a", metrics="open") as c:
        assert c.get("/metrics").status_code == 200
    with make_client(tmp_path / "b", metrics="off") as c:
        assert c.get("/metrics", headers=admin_headers()).status_code == 404


def test_request_id_is_returned_and_validated(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        r = c.get("/healthz", headers={"X-Request-ID": "req-42.a:b_C"})
        assert r.headers["x-request-id"] == "req-42.a:b_C"
        fresh = c.get("/healthz").headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{16}", fresh)
        # A hostile id (too long, or with characters a log line must not carry) is replaced.
        for bad in ("x" * 129, "a b", 'a"}{', "\u00e9".encode()):
            got = c.get("/healthz", headers={"X-Request-ID": bad})
            assert got.headers["x-request-id"] not in (bad, "") and valid_request_id(
                got.headers["x-request-id"]
            )
        # Error answers carry it too (a 413 of the body limit, refused before any route).
        big = c.post(
            "/v1/classify",
            content=b"x" * (5 * 2**20),
            headers={"X-Request-ID": "big-1", **user_headers()},
        )
        assert big.status_code == 413 and big.headers["x-request-id"] == "big-1"


def test_access_log_lines_in_both_formats_leak_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with make_client(tmp_path) as c:
        cid = c.post("/v1/contexts", json=secret_context(None), headers=admin_headers()).json()[
            "id"
        ]
        q = {"context_id": cid, "query": QUERY_SECRET}
        r = c.post("/v1/classify", json=q, headers={"X-Request-ID": "rid-7", **user_headers()})
        assert r.status_code == 200
    access = [rec for rec in caplog.records if rec.name == "dpicl.access"]
    mine = [rec for rec in access if getattr(rec, "request_id", None) == "rid-7"]
    assert len(mine) == 1
    line = json.loads(JsonFormatter().format(mine[0]))
    assert line["route"] == "/v1/classify" and line["status"] == 200
    assert line["method"] == "POST" and line["latency_ms"] > 0
    # The key that spent it, by id (a static key's is derived; never the secret).
    assert line["key_id"] == static_key_id(USER) and USER not in json.dumps(line)
    assert line["request_id"] == "rid-7" and line["logger"] == "dpicl.access"
    assert "rid-7" in TextFormatter().format(mine[0])
    every = "\n".join(JsonFormatter().format(rec) for rec in caplog.records)
    for leaked in (SECRET, QUERY_SECRET, ADMIN, USER, cid + "/"):
        assert leaked not in every


def test_served_process_writes_json_logs(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "oracle",
            "DPICL_LOG_FORMAT": "json",
            "DPICL_LOG_LEVEL": "info",
            "DPICL_METRICS": "open",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/json.db",
        }
    )
    with httpx.Client(base_url=srv.url, timeout=30) as h:
        cid = h.post("/v1/contexts", json=secret_context(None), headers=admin_headers()).json()[
            "id"
        ]
        r = h.post(
            "/v1/classify",
            json={"context_id": cid, "query": QUERY_SECRET},
            headers={"X-Request-ID": "proc-1", **user_headers()},
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "proc-1"
        assert "dpicl_http_requests_total" in h.get("/metrics").text
    srv.stop()
    lines = srv.log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    # Every line the server wrote is a JSON object (uvicorn's own included).
    assert records and len(records) == len([ln for ln in lines if ln.strip()]), lines
    access = [r for r in records if r["logger"] == "dpicl.access"]
    assert {(a["method"], a["route"], a["status"]) for a in access} >= {
        ("POST", "/v1/contexts", 201),
        ("POST", "/v1/classify", 200),
        ("GET", "/metrics", 200),
    }
    assert any(a["request_id"] == "proc-1" for a in access)
    text = "\n".join(lines)
    for leaked in (SECRET, QUERY_SECRET, ADMIN, USER):
        assert leaked not in text


async def keyed(request: Request) -> dict[str, str]:
    """A route whose authentication identified a key (as per-key auth does)."""
    request.state.key_id = "key_0123abcd"
    return {"ok": "yes"}


def test_access_log_carries_the_key_id_the_authentication_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Per-key authentication puts the key's id in ``request.state.key_id``; the access log
    line carries it (and nothing else of the key)."""
    caplog.set_level(logging.INFO, logger="dpicl.access")
    with make_client(tmp_path) as c:
        c.app.add_api_route("/test-keyed", keyed)  # type: ignore[attr-defined]
        assert c.get("/test-keyed", headers={"X-Request-ID": "keyed-1"}).status_code == 200
    (rec,) = [r for r in caplog.records if getattr(r, "request_id", None) == "keyed-1"]
    line = json.loads(JsonFormatter().format(rec))
    assert line["key_id"] == "key_0123abcd" and line["route"] == "/test-keyed"
