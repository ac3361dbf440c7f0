"""Failures answer clearly and cost nothing: database errors (503 storage_unavailable, no
private text logged), readiness, a held SQLite lock, and an engine failure that must not
make a concurrent valid query fail for want of budget."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

from dpicl.engines.base import FloatArray, PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.hostile_cases import SECRET, json_log


class FailsOnQuery(OracleEngine):
    """The oracle, except that a query containing FAIL fails after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        if prompts and "FAIL" in prompts[0].query:
            await asyncio.sleep(self.delay)
            raise RuntimeError(f"model crashed on {prompts[0].text}")  # quotes exemplars
        return await super().score_labels(prompts, labels)


def _one_answer_context() -> dict[str, object]:
    # Analytic calibration: one answer costs exactly the budget's mu^2, so one answer fits.
    return voting_context(
        mechanism={"epsilon": 1.0, "delta": 1e-5, "calibration": "analytic"},
        budget={"epsilon": 1.0, "delta": 1e-5},
    )


def test_failing_call_does_not_hold_the_last_unit_of_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with make_client(tmp_path, engine=FailsOnQuery(delay=1.5)) as c:
        body = _one_answer_context()
        body["exemplars"][0]["input"] = f"{SECRET} record"  # type: ignore[index]
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        assert r.json()["spent"]["remaining_queries"] == 1

        def ask(query: str) -> tuple[int, dict[str, object]]:
            resp = c.post(
                "/v1/classify", json={"context_id": cid, "query": query}, headers=user_headers()
            )
            return resp.status_code, resp.json()

        with ThreadPoolExecutor(2) as pool:
            failing = pool.submit(ask, "FAIL please")
            time.sleep(0.5)  # the failing call now holds the last unit
            valid = pool.submit(ask, "an ordinary question")
            (fs, fb), (vs, vb) = failing.result(timeout=30), valid.result(timeout=30)
        assert fs == 503 and fb["error"]["code"] == "engine_unavailable", fb  # type: ignore[index]
        assert SECRET not in str(fb)
        assert vs == 200, vb  # it waited for the failure's refund instead of being refused
        assert vb["budget"]["remaining_queries"] == 0  # type: ignore[index]
        status, again = ask("one more")
        assert status == 402 and again["error"]["code"] == "budget_exhausted"  # type: ignore[index]
    assert SECRET not in caplog.text
    assert SECRET not in json_log(caplog.records)


def test_database_lock_answers_503_and_logs_no_exemplar(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything any logger writes, SQLAlchemy's included
    with make_client(tmp_path, db_timeout_s=0.5, db_threads=2) as c:
        r = c.post("/v1/contexts", json=_one_answer_context(), headers=admin_headers())
        cid = r.json()["id"]
        created = datetime.fromisoformat(r.json()["created_at"])
        assert created.utcoffset() is not None  # timezone-aware, on SQLite too

        holder = sqlite3.connect(tmp_path / "dpicl.db", timeout=0.1)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            body = voting_context(budget={"epsilon": 1.0, "delta": 1e-5})
            body["exemplars"][0]["input"] = f"{SECRET} record"
            with ThreadPoolExecutor(8) as pool:
                writes = [
                    pool.submit(c.post, "/v1/contexts", json=body, headers=admin_headers())
                    for _ in range(6)
                ]
                time.sleep(0.1)
                t0 = time.monotonic()
                read = c.get(f"/v1/contexts/{cid}", headers=admin_headers())
                read_s = time.monotonic() - t0
                live = c.get("/healthz")
                results = [w.result(timeout=60) for w in writes]
            assert read.status_code == 200 and live.status_code == 200
            # Reads have their own threads: queued writers do not delay them.
            assert read_s < 0.5, read_s
            for w in results:
                assert w.status_code == 503, w.text
                assert w.json()["error"]["code"] == "storage_unavailable"
                assert SECRET not in w.text
            # A charge refused by the lock charges nothing.
            q = c.post(
                "/v1/classify", json={"context_id": cid, "query": "hi"}, headers=user_headers()
            )
            assert q.status_code == 503 and q.json()["error"]["code"] == "storage_unavailable"
        finally:
            holder.rollback()
            holder.close()
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == 0
        assert len(c.get("/v1/contexts", headers=admin_headers()).json()["data"]) == 1
    assert "database error" in caplog.text
    assert SECRET not in caplog.text
    assert SECRET not in json_log(caplog.records)


def test_liveness_and_readiness(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        for path in ("/healthz", "/livez", "/readyz"):
            r = c.get(path)
            assert r.status_code == 200 and r.json()["status"] == "ok", (path, r.text)
        assert c.get("/readyz").json()["database"] == "ok"
        # The database goes away: liveness stays, readiness says why.
        c.app.state.services.repo.engine.dispose()  # type: ignore[attr-defined]
        (tmp_path / "dpicl.db").unlink()
        (tmp_path / "dpicl.db").mkdir()  # no database can be opened at that path now
        assert c.get("/healthz").status_code == 200
        r = c.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "storage_unavailable"
        assert str(tmp_path) not in r.text


def test_405_names_the_allowed_methods(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        r = c.put("/v1/contexts", headers=admin_headers())
        assert r.status_code == 405
        assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
        assert r.json()["error"]["code"] == "method_not_allowed"
