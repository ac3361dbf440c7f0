"""DPS-MOZO offline synthesis is bounded: at most DPICL_MAX_SYNTHESIZE_INPUTS inputs per
request, and a client that leaves stops it between inputs. Whatever ends it early, the
inputs answered stay charged and their outputs are kept; nothing that never ran is charged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from dpicl.config import Settings
from dpicl.engines.oracle.engine import OracleEngine
from tests.conftest import admin_headers
from tests.server.api_helpers import make_client
from tests.server.test_api_mozo import create, mozo_context


class CountingEngine(OracleEngine):
    """The oracle, counting DPS-MOZO decoding sessions (one per answered input) and failing
    the ``fail_at``-th one (1-based) when set."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.sessions = 0
        self.fail_at = fail_at

    async def open_decoding(self, *args: Any, **kwargs: Any) -> Any:
        self.sessions += 1
        if self.sessions == self.fail_at:
            raise RuntimeError("the model crashed")
        return await super().open_decoding(*args, **kwargs)


def _inputs(n: int) -> list[str]:
    return [f"public input {i}" for i in range(n)]


def _contexts(client: TestClient) -> dict[str, dict[str, Any]]:
    listed = client.get("/v1/contexts", headers=admin_headers()).json()["data"]
    return {c["id"]: c for c in listed}


def test_too_many_inputs_are_refused_naming_the_setting(tmp_path: Path) -> None:
    with make_client(tmp_path, max_synthesize_inputs=3) as c:
        info = create(c, mozo_context(queries=10))
        url = f"/v1/contexts/{info['id']}/synthesize"
        r = c.post(url, json={"inputs": _inputs(4)}, headers=admin_headers())
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["param"] == "inputs"
        assert "4 items" in err["message"] and "DPICL_MAX_SYNTHESIZE_INPUTS" in err["message"]
        assert "at most 3" in err["message"]
        # The schema's hard bound, whatever the setting.
        r = c.post(url, json={"inputs": ["x"] * 10_001}, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == "inputs"
        r = c.post(url, json={"inputs": _inputs(3)}, headers=admin_headers())
        assert r.status_code == 201, r.text
        # Only the accepted request was charged.
        assert _contexts(c)[info["id"]]["spent"]["queries"] == 3


def test_the_limit_setting_is_validated() -> None:
    assert Settings().max_synthesize_inputs == 100
    for bad in (0, -1, 10_001):
        with pytest.raises(ValidationError, match="max_synthesize_inputs"):
            Settings(max_synthesize_inputs=bad)


def test_invisible_input_is_refused(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        info = create(c, mozo_context())
        r = c.post(
            f"/v1/contexts/{info['id']}/synthesize",
            json={"inputs": ["fine", "\u200b\u200c\u2060\ufeff"]},
            headers=admin_headers(),
        )
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "inputs.1"
        assert "visible character" in r.json()["error"]["message"]
        assert _contexts(c)[info["id"]]["spent"]["queries"] == 0


async def _post_then_leave(
    app: FastAPI, path: str, body: dict[str, Any], engine: CountingEngine, leave_after: int
) -> list[dict[str, Any]]:
    """POST ``body`` as an ASGI client that disconnects once ``leave_after`` inputs ran."""
    delivered = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": json.dumps(body).encode()}
        if engine.sessions >= leave_after:
            return {"type": "http.disconnect"}
        await anyio.sleep_forever()  # still connected: nothing to receive
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [
        (k.lower().encode(), v.encode())
        for k, v in (admin_headers() | {"content-type": "application/json"}).items()
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
        "state": {},
    }
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("leave_after", [0, 2])
def test_a_client_that_leaves_stops_the_synthesis(tmp_path: Path, leave_after: int) -> None:
    engine = CountingEngine()
    with make_client(tmp_path, engine=engine) as c:
        info = create(c, mozo_context(queries=10))
        path = f"/v1/contexts/{info['id']}/synthesize"
        body = {"inputs": _inputs(6), "name": "syn"}
        sent = c.portal.call(_post_then_leave, c.app, path, body, engine, leave_after)
        assert sent[0]["status"] == 499
        assert engine.sessions == leave_after  # the 4 inputs nobody waited for never ran
        listed = _contexts(c)
        source = listed.pop(info["id"])
        # Exactly what ran was charged ...
        assert source["spent"]["queries"] == leave_after
        assert source["spent"]["remaining_queries"] == 10 - leave_after
        # ... and what was paid for is kept, marked partial (nothing when nothing ran).
        if leave_after == 0:
            assert listed == {}
        else:
            [derived] = listed.values()
            assert derived["mechanism"]["derived_from"] == info["id"]
            assert derived["n_exemplars"] == leave_after
            assert derived["name"] == f"syn (partial: {leave_after} of 6 inputs)"


def test_an_engine_failure_midway_keeps_what_was_paid_for(tmp_path: Path) -> None:
    engine = CountingEngine(fail_at=3)
    with make_client(tmp_path, engine=engine) as c:
        info = create(c, mozo_context(queries=10))
        r = c.post(
            f"/v1/contexts/{info['id']}/synthesize",
            json={"inputs": _inputs(5)},
            headers=admin_headers(),
        )
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        listed = _contexts(c)
        source = listed.pop(info["id"])
        # Inputs 0 and 1 were answered and stay charged; input 2 failed and was refunded.
        assert source["spent"]["queries"] == 2
        [derived] = listed.values()
        assert derived["n_exemplars"] == 2
        assert derived["name"].endswith("(partial: 2 of 5 inputs)")
        assert f"stored as context {derived['id']}" in message
        assert "2 queries of " + info["id"] in message


def test_a_derived_name_fits_the_name_column(tmp_path: Path) -> None:
    """A source named with all 200 characters made the default name 212 (PostgreSQL's
    varchar(200) refused it, after every output had been paid for)."""
    with make_client(tmp_path) as c:
        info = create(c, mozo_context() | {"name": "n" * 200})
        r = c.post(
            f"/v1/contexts/{info['id']}/synthesize",
            json={"inputs": _inputs(1)},
            headers=admin_headers(),
        )
        assert r.status_code == 201, r.text
        name = r.json()["context"]["name"]
        assert len(name) == 200 and name.endswith(" (synthetic)")


def test_a_storage_failure_at_the_end_says_what_was_charged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repository's own 503 says "nothing was changed or charged"; after a synthesis
    every answered input was charged, and the message must say so."""
    from dpicl.errors import StorageUnavailable
    from dpicl.store.repository import ContextRepository

    with make_client(tmp_path) as c:
        info = create(c, mozo_context(queries=10))

        async def down(self: ContextRepository, row: object) -> None:
            raise StorageUnavailable(
                "the database is unavailable or busy; nothing was changed or charged"
            )

        monkeypatch.setattr(ContextRepository, "add", down)
        r = c.post(
            f"/v1/contexts/{info['id']}/synthesize",
            json={"inputs": _inputs(3)},
            headers=admin_headers(),
        )
        monkeypatch.undo()
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "nothing was changed or charged" not in message
        assert f"3 answered inputs stay charged (3 queries of {info['id']})" in message
        assert _contexts(c)[info["id"]]["spent"]["queries"] == 3
