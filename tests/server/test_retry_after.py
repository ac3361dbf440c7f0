"""Every retryable 503 says when to retry (issue 47): ``storage_unavailable`` after the
storage deadline (DPICL_DB_TIMEOUT_S), ``engine_unavailable`` after the engine's restart
backoff; on both surfaces. A 402 still never carries one."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpicl.engines.base import PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from dpicl.errors import EngineError
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context


def test_storage_unavailable_says_retry_after_the_storage_deadline(tmp_path: Path) -> None:
    with make_client(tmp_path, db_timeout_s=2.5) as c:
        assert c.post("/v1/keys", json={"tenant": "a"}, headers=admin_headers()).status_code == 201
        # Another process holds SQLite's write lock: a write waits out the deadline.
        other = sqlite3.connect(tmp_path / "dpicl.db", isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            r = c.post("/v1/keys", json={"tenant": "a"}, headers=admin_headers())
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "storage_unavailable"
        assert r.headers["Retry-After"] == "3"  # ceil(2.5)


class _FailingEngine(OracleEngine):
    """An engine that is down, restarting in 7.2 s."""

    def retry_after_s(self) -> float:
        return 7.2

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> np.ndarray:
        raise EngineError("the engine process died (test)")


def test_engine_unavailable_says_retry_after_the_restart_backoff(tmp_path: Path) -> None:
    with make_client(tmp_path, engine=_FailingEngine()) as c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        r = c.post("/v1/classify", json={"context_id": cid, "query": "q"}, headers=user_headers())
        assert (r.status_code, r.json()["error"]["code"]) == (503, "engine_unavailable")
        assert r.headers["Retry-After"] == "8"
        body = {"model": cid, "messages": [{"role": "user", "content": "q"}]}
        r = c.post("/v1/chat/completions", json=body, headers=user_headers())
        assert r.status_code == 503 and r.headers["Retry-After"] == "8", r.text


def test_engine_unavailable_without_restarts_says_one_second(tmp_path: Path) -> None:
    class Down(OracleEngine):
        async def score_labels(
            self, prompts: Sequence[PromptSpec], labels: Sequence[str]
        ) -> np.ndarray:
            raise EngineError("down")

    with make_client(tmp_path, engine=Down()) as c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        r = c.post("/v1/classify", json={"context_id": cid, "query": "q"}, headers=user_headers())
        assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text


def test_livez_fails_only_when_restarts_keep_failing(tmp_path: Path) -> None:
    class Failing(OracleEngine):
        why: str | None = None

        def not_alive(self) -> str | None:
            return self.why

    engine = Failing()
    with make_client(tmp_path, engine=engine) as c:
        assert c.get("/livez").status_code == 200
        engine.why = "the engine process has failed to restart 5 times in a row"
        r = c.get("/livez")
        assert (r.status_code, r.json()["error"]["code"]) == (503, "engine_unavailable")
        assert "5 times in a row" in r.json()["error"]["message"]
        assert c.get("/healthz").status_code == 200  # the process itself answers
