"""``/readyz`` means ready (issue 26): the database answers at the code's schema revision
(read from the migration scripts, never hard-coded), the engine is loaded, and the sentence
embedder loaded at start, or the route answers 503 with the reason."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from dpicl.api.app import build_app
from dpicl.config import Settings
from dpicl.engines import factory
from dpicl.engines.base import Embedder, FloatArray
from dpicl.store.migrations import head
from tests.conftest import ADMIN
from tests.server.api_helpers import make_client


def test_ready_names_the_schema_revision_and_a_missing_schema_is_not_ready(
    tmp_path: Path,
) -> None:
    with make_client(tmp_path) as c:
        r = c.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["schema_revision"] == head()
        assert r.json()["embedder"] == "on first use"  # the oracle loads it lazily
        db = sqlite3.connect(tmp_path / "dpicl.db")
        # A database behind the code (another revision): not ready, and why.
        db.execute("UPDATE alembic_version SET version_num = '0001'")
        db.commit()
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["error"]["code"] == "storage_unavailable"
        assert f"at revision 0001; this server needs {head()}" in r.json()["error"]["message"]
        # No schema at all (a fresh or wiped database).
        for table in ("alembic_version", "dpicl_contexts"):
            db.execute(f"DROP TABLE {table}")
        db.commit()
        db.close()
        r = c.get("/readyz")
        assert r.status_code == 503, r.text
        assert "revision none (no schema)" in r.json()["error"]["message"]
        assert "dpicl migrate" in r.json()["error"]["message"]
        assert c.get("/livez").status_code == 200  # alive, just not ready


class FakeEmbedder:
    """Stands in for a loaded sentence embedder (the test is about when it loads)."""

    name = "fake"
    dim = 2

    async def embed(self, texts: Sequence[str]) -> FloatArray:
        return np.ones((len(texts), 2)) / np.sqrt(2)


def client_with_embedder(tmp_path: Path, embedder: str | None) -> TestClient:
    """An oracle app that loads the embedder ``embedder`` (DPICL_EMBEDDER) at start."""
    settings = Settings(
        engine="oracle",
        database_url=f"sqlite:///{tmp_path / 'dpicl.db'}",
        admin_token=ADMIN,
        embedder=embedder,
        preload_embedder=True,
    )
    return TestClient(build_app(settings))


def test_the_embedder_loads_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str | None] = []

    def build(name: str | None, device: str) -> Embedder:
        loaded.append(name)
        return FakeEmbedder()

    monkeypatch.setattr(factory, "build_embedder", build)
    with client_with_embedder(tmp_path, "some/embedder") as c:
        assert loaded == ["some/embedder"]  # in the lifespan, before any request
        assert c.get("/readyz").json()["embedder"] == "loaded"
    # The default: at start for a language-model engine, on first use for the oracle.
    assert Settings(engine="transformers").embedder_at_start()
    assert not Settings(engine="oracle").embedder_at_start()
    assert Settings(engine="oracle", preload_embedder=True).embedder_at_start()


def test_an_embedder_that_cannot_load_at_start_is_not_ready(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-embedder"
    with client_with_embedder(tmp_path / "b", str(missing)) as c:
        r = c.get("/readyz")
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "engine_unavailable"
        assert "sentence embedder failed to load at start" in err["message"]
        assert "DPICL_EMBEDDER" in err["message"]
        assert str(missing) not in r.text  # the path is for the operator's log only
        assert c.get("/healthz").status_code == 200


def test_health_publishes_the_context_limits_a_client_plans_around(tmp_path: Path) -> None:
    """Every health route names the limits a context is checked against (issue 27 item 5:
    the auditor sizes its budgeted contexts within max_budget_epsilon), without a token; a
    context at the published limit is taken, one above it refused."""
    with make_client(
        tmp_path, allow_unbudgeted=False, max_budget_epsilon=50.0, max_epsilon=20.0
    ) as c:
        for route in ("/healthz", "/livez", "/readyz"):
            r = c.get(route)
            assert r.status_code == 200, (route, r.text)
            assert r.json()["limits"] == {
                "max_budget_epsilon": 50.0,
                "allow_unbudgeted": False,
                "max_epsilon": 20.0,
                "max_partitions": 1000,
                "max_exemplars": 10_000,
                "max_labels": 100,
                "max_query_chars": 8000,
            }, route
        body = {
            "name": "x",
            "task": "classification",
            "labels": ["a", "b"],
            "exemplars": [{"input": f"q{i}", "output": "ab"[i % 2]} for i in range(4)],
            "mechanism": {"name": "voting", "epsilon": 1.0, "delta": 1e-5, "partitions": 2},
        }
        headers = {"Authorization": f"Bearer {ADMIN}"}
        at = c.post(
            "/v1/contexts",
            json=body | {"budget": {"epsilon": 50.0, "delta": 1e-5}},
            headers=headers,
        )
        assert at.status_code == 201, at.text
        above = c.post(
            "/v1/contexts",
            json=body | {"budget": {"epsilon": 50.5, "delta": 1e-5}},
            headers=headers,
        )
        assert above.status_code == 422 and "DPICL_MAX_BUDGET_EPSILON" in above.text, above.text
