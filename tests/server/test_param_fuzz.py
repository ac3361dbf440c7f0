"""Every id, cursor and name is checked before it reaches the database (issue 47): NUL bytes,
bytes that are not UTF-8, lone surrogates and overlong values in every path parameter, query
parameter and body string of every route get a 4xx naming the value, on SQLite and on
PostgreSQL (which refuses NUL in text), and the store counts no error of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dpicl.metrics import DB_ERRORS
from tests.conftest import admin_headers
from tests.server.api_helpers import make_client, voting_context

#: Raw (already percent-encoded) values for a URL: NUL, a byte that is not UTF-8, a UTF-8
#: encoded surrogate, an overlong NUL, a control character, a space, non-ASCII text, and
#: values over any id's length; some with a valid prefix, so no prefix check hides them.
URL_VALUES = [
    "%00",
    "key_%00",
    "ctx_%00",
    "ctx_" + "0" * 24 + "%00",
    "key_" + "0" * 24 + "%00",
    "%FF",
    "%ED%A0%80",
    "%C0%80",
    "a%0Ab",
    "a%20b",
    "%C3%A9",
    "a" * 300,
    "key_" + "f" * 5000,
]

#: Strings for JSON bodies: NUL, lone surrogates (JSON's "\ud800"), overlong.
BODY_VALUES = ["\x00", "a\x00b", "\ud800", "x\udfffy", "y" * 100_001]

#: Every path with parameters, with the value put in place of PARAM.
PATHS = [
    ("GET", "/v1/contexts/PARAM"),
    ("DELETE", "/v1/contexts/PARAM"),
    ("GET", "/v1/contexts/PARAM/spend"),
    ("POST", "/v1/contexts/PARAM/synthesize"),
    ("DELETE", "/v1/keys/PARAM"),
    ("GET", "/v1/models/PARAM"),
]
QUERIES = [
    ("/v1/contexts", "cursor"),
    ("/v1/contexts", "limit"),
    ("/v1/keys", "after"),
    ("/v1/keys", "limit"),
    ("/v1/keys", "revoked"),
    ("/v1/models", "after"),
    ("/v1/models", "limit"),
    ("/v1/contexts/CID/spend", "recent"),
]


def _db_errors() -> float:
    return sum(s.value for m in DB_ERRORS.collect() for s in m.samples if s.name.endswith("_total"))


def _leaves(body: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The paths of every string in a JSON value."""
    if isinstance(body, str):
        yield path
    elif isinstance(body, dict):
        for k, v in body.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(body, list):
        for i, v in enumerate(body):
            yield from _leaves(v, (*path, i))


def _replaced(body: Any, path: tuple[Any, ...], value: str) -> Any:
    if not path:
        return value
    copy = dict(body) if isinstance(body, dict) else list(body)
    copy[path[0]] = _replaced(body[path[0]], path[1:], value)
    return copy


def _bodies(cid: str) -> list[tuple[str, dict[str, Any]]]:
    ctx = voting_context(tenant="acme", budget={"epsilon": 10.0, "delta": 1e-5})
    ctx["exemplars"] = ctx["exemplars"][:4]
    return [
        ("/v1/keys", {"name": "n", "tenant": "acme"}),
        ("/v1/keys", {"contexts": [cid]}),
        ("/v1/contexts", ctx),
        ("/v1/classify", {"context_id": cid, "query": "q"}),
        ("/v1/generate", {"context_id": cid, "query": "q"}),
        ("/v1/zero-shot", {"context_id": cid, "query": "q"}),
        ("/v1/chat/completions", {"model": cid, "messages": [{"role": "user", "content": "q"}]}),
        ("/v1/completions", {"model": cid, "prompt": "q"}),
        ("/v1/contexts/CID/synthesize", {"inputs": ["q"]}),
    ]


def _check(r: Any, what: str) -> None:
    assert r.status_code < 500, (what, r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["message"], (what, err)


def _fuzz(c: TestClient) -> int:
    h = admin_headers()
    r = c.post("/v1/contexts", json=voting_context(tenant="acme"), headers=h)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    sent = 0
    for method, template in PATHS:
        for value in URL_VALUES:
            body = {"inputs": ["q"]} if method == "POST" else None
            r = c.request(method, template.replace("PARAM", value), json=body, headers=h)
            _check(r, f"{method} {template} {value[:20]}")
            assert 400 <= r.status_code < 500
            param = r.json()["error"]["param"]
            assert param in ("context_id", "key_id", "model"), (template, value[:20], param)
            sent += 1
    for path, name in QUERIES:
        for value in URL_VALUES:
            r = c.get(f"{path.replace('CID', cid)}?{name}={value}", headers=h)
            _check(r, f"{path}?{name}={value[:20]}")
            assert r.status_code in (400, 404, 422), (path, name, value[:20], r.status_code)
            assert r.json()["error"]["param"] == name, (path, name, value[:20], r.json())
            sent += 1
    for path, body in _bodies(cid):
        path = path.replace("CID", cid)
        for leaf in _leaves(body):
            for value in BODY_VALUES:
                bad = _replaced(body, leaf, value)
                r = c.post(
                    path, content=json.dumps(bad), headers=h | {"content-type": "application/json"}
                )
                _check(r, f"{path} {leaf} {value[:10]!r}")
                sent += 1
    return sent


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: Any, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fuzz.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.mark.postgres
def test_ids_cursors_and_names_never_reach_the_database(tmp_path: Path, database_url: str) -> None:
    before = _db_errors()
    with make_client(tmp_path, database_url=database_url, whitebox="off") as c:
        sent = _fuzz(c)
        assert sent > 300
        # The server still answers, and nothing of the fuzz was stored as a key.
        keys = c.get("/v1/keys", headers=admin_headers())
        assert keys.status_code == 200 and keys.json()["data"] == []
    assert _db_errors() == before
