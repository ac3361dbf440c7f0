"""Logs a collector can read (issue 39), in one real ``dpicl serve`` process started the way
a user starts it (a relative database path, in its working directory) with
``DPICL_LOG_FORMAT=json`` and the embedder loaded at start:

* every line on the stream is one JSON object: loading the embedder draws no progress bar
  into it;
* a line written from a storage thread (a database error) carries its request's id;
* ``/readyz`` writes no alembic lines, however often it is asked;
* no record has uvicorn's ``color_message`` field, and no line an ANSI escape;
* no migration lock file is left in the working directory.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import voting_context


def _records(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return lines, [json.loads(ln) for ln in lines if ln.startswith("{")]


@pytest.mark.slow  # the embedder's load at start: about a minute on a busy 2-core machine
def test_json_logs_are_one_object_per_line_with_request_ids(
    start_server: Any, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    srv = start_server(
        {
            "DPICL_ENGINE": "oracle",
            "DPICL_LOG_FORMAT": "json",
            "DPICL_LOG_LEVEL": "info",
            # The default's form: relative to the working directory.
            "DPICL_DATABASE_URL": "sqlite:///./dpicl.db",
            "DPICL_PRELOAD_EMBEDDER": "true",
            # A stream that is not a terminal is where progress bars used to land anyway.
            "TQDM_DISABLE": "",
            "HF_HUB_DISABLE_PROGRESS_BARS": "",
        },
        command=[
            "sh",
            "-c",
            f'cd "{work}" && exec "{sys.executable}" -m dpicl serve --port {{port}}',
        ],
    )
    with httpx.Client(base_url=srv.url, timeout=60) as h:
        ready = h.get("/readyz")
        assert ready.status_code == 200 and ready.json()["embedder"] == "loaded", ready.text
        _, records = _records(srv.log_path)
        alembic_before = sum(r["logger"].startswith("alembic") for r in records)
        for _ in range(5):
            assert h.get("/readyz").status_code == 200
        cid = h.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        # A real database failure, met by a request: the table its charge writes is gone.
        with sqlite3.connect(work / "dpicl.db") as db:
            db.execute("DROP TABLE dpicl_spend")
        r = h.post(
            "/v1/classify",
            json={"context_id": cid, "query": "q"},
            headers={"X-Request-ID": "db-fails-1", **user_headers()},
        )
        assert r.status_code == 503, r.text
    srv.stop()
    lines, records = _records(srv.log_path)
    # One JSON object per line, nothing else on the stream (no progress bar, no banner).
    assert len(records) == len(lines), [ln for ln in lines if not ln.startswith("{")][:5]
    assert not any("\x1b" in ln or "\r" in ln for ln in lines)
    assert not any("color_message" in r for r in records)
    # /readyz five times: not one alembic line more (the start's migration wrote its own).
    assert sum(r["logger"].startswith("alembic") for r in records) == alembic_before
    # The database error, written in a storage thread, carries the request's id.
    db_errors = [r for r in records if r["message"].startswith("database error")]
    assert db_errors and all(r["request_id"] == "db-fails-1" for r in db_errors), db_errors
    # The migration's lock is not left in the working directory.
    assert sorted(p.name for p in work.iterdir() if "lock" in p.name) == []
    assert (work / "dpicl.db").exists()
