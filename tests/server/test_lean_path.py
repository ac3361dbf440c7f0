"""The lean request path (issue 13, item 2): async dependencies, one prebuilt charge
statement, contexts cached per process without ever charging a deleted one, SQLite writes
serialised per database, no database work on the event loop, and the no-overspend
guarantee across processes on SQLite."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import event

from dpicl.serving.contexts import cost_of
from dpicl.store import repository
from dpicl.store.context_cache import ContextCache, context_bytes
from dpicl.store.repository import ContextRepository, sqlite_write_lock
from tests.conftest import _pg_available, admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.test_ledger_postgres import two_processes_never_overspend

ROOT = Path(__file__).resolve().parents[2]


def test_no_request_hops_to_the_thread_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FastAPI runs a plain def dependency (or route) through anyio's thread pool, one hop
    # per request; database work has its own executors. Count the hops of real requests.
    hops: list[str] = []
    real = anyio.to_thread.run_sync

    async def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__qualname__", repr(func)))
        return await real(func, *args, **kwargs)

    with make_client(tmp_path, whitebox="noisy") as c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
        ask = {"context_id": cid, "query": "hop?"}
        assert c.post("/v1/classify", json=ask, headers=user_headers()).status_code == 200
        assert c.post("/v1/debug/classify", json=ask, headers=admin_headers()).status_code == 200
        assert c.get(f"/v1/contexts/{cid}", headers=admin_headers()).status_code == 200
        assert c.get("/healthz").status_code == 200
    assert hops == [], hops


def test_the_charge_is_one_prebuilt_statement_off_the_event_loop(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        repo: ContextRepository = c.app.state.services.repo  # type: ignore[attr-defined]
        statements: list[tuple[str, str]] = []

        def record(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
            statements.append((threading.current_thread().name, sql))

        event.listen(repo.engine, "before_cursor_execute", record)
        try:
            for i in range(3):
                r = c.post(
                    "/v1/classify",
                    json={"context_id": cid, "query": f"q {i}"},
                    headers=user_headers(),
                )
                assert r.status_code == 200, r.text
                assert r.json()["budget"]["queries"] == i + 1
        finally:
            event.remove(repo.engine, "before_cursor_execute", record)
    # The first query loads the context (one SELECT) into the cache; every answer is then
    # exactly one UPDATE ... RETURNING, always the same SQL, always on a database thread.
    updates = [s for _, s in statements if s.lstrip().upper().startswith("UPDATE")]
    selects = [s for _, s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(updates) == 3 and len(set(updates)) == 1, statements
    assert "RETURNING" in updates[0].upper()
    assert len(selects) <= 1, statements  # the first load only
    assert all(name.startswith("dpicl-db-") for name, _ in statements), statements
    # Built once at import: the module-level statement is what runs.
    assert str(repository.CHARGE.compile(repo.engine)).split() == updates[0].split()


def test_a_context_deleted_by_another_process_is_never_charged(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        body = voting_context(budget={"epsilon": 50.0, "delta": 1e-5})
        cid = c.post("/v1/contexts", json=body, headers=admin_headers()).json()["id"]
        ask = {"context_id": cid, "query": "is it there"}
        assert c.post("/v1/classify", json=ask, headers=user_headers()).status_code == 200
        repo: ContextRepository = c.app.state.services.repo  # type: ignore[attr-defined]
        assert repo.cache.get(cid) is not None
        # Another process deletes it: this process's cache still holds the context.
        other = ContextRepository(repo.url)
        try:
            assert asyncio.run(other.delete(cid))
        finally:
            other.dispose()
        r = c.post("/v1/classify", json=ask, headers=user_headers())
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        assert repo.cache.get(cid) is None


def test_cache_shows_fresh_budgets_after_charges_by_another_process(tmp_path: Path) -> None:
    # One answer's worth of budget: the charge decides, not the cached ledger columns.
    body = voting_context(
        mechanism={"epsilon": 1.0, "delta": 1e-5, "calibration": "analytic"},
        budget={"epsilon": 1.0, "delta": 1e-5},
    )
    with make_client(tmp_path) as c:
        cid = c.post("/v1/contexts", json=body, headers=admin_headers()).json()["id"]
        repo: ContextRepository = c.app.state.services.repo  # type: ignore[attr-defined]
        asyncio.run(repo.get(cid))  # cached with nothing spent
        other = ContextRepository(repo.url)
        try:
            ctx = asyncio.run(other.get(cid))
            assert ctx is not None
            assert asyncio.run(other.try_charge(cid, cost_of(ctx).mu2)) is not None
        finally:
            other.dispose()
        r = c.post("/v1/classify", json={"context_id": cid, "query": "x"}, headers=user_headers())
        assert r.status_code == 402 and r.json()["error"]["code"] == "budget_exhausted", r.text


def test_context_cache_is_bounded_by_bytes(tmp_path: Path) -> None:
    async def contexts() -> list[Any]:
        repo = ContextRepository(f"sqlite:///{tmp_path / 'c.db'}")
        repo.migrate()
        from dpicl.serving.contexts import create_context
        from dpicl.spec import ContextSpec

        out = []
        for _ in range(4):
            out.append(await create_context(ContextSpec.model_validate(voting_context()), repo))
        repo.dispose()
        return out

    ctxs = asyncio.run(contexts())
    size = context_bytes(ctxs[0])
    cache = ContextCache(int(2.5 * size))
    for ctx in ctxs:
        cache.put(ctx)
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    assert cache.get(ctxs[0].id) is None and cache.get(ctxs[3].id) is not None
    cache.evict(ctxs[3].id)
    assert len(cache) == 1 and cache.nbytes == context_bytes(ctxs[2])
    assert ContextCache(0).get(ctxs[0].id) is None  # 0 disables it
    off = ContextCache(0)
    off.put(ctxs[0])
    assert len(off) == 0


def test_sqlite_write_lock_is_one_per_database_file(tmp_path: Path) -> None:
    a = sqlite_write_lock(f"sqlite:///{tmp_path / 'a.db'}")
    assert a is not None
    assert sqlite_write_lock(f"sqlite:///{tmp_path}/./a.db") is a
    assert sqlite_write_lock(f"sqlite:///{tmp_path / 'b.db'}") is not a
    assert sqlite_write_lock("sqlite://") is None
    assert sqlite_write_lock("postgresql+psycopg://u@h/db") is None


def test_serialised_writes_wait_for_the_lock_at_most_the_timeout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    repo = ContextRepository(url, timeout_s=0.3)
    repo.migrate()
    lock = sqlite_write_lock(url)
    assert lock is not None
    try:
        with lock:  # another request of this process is writing
            from dpicl.errors import StorageUnavailable

            with pytest.raises(StorageUnavailable, match="busy"):
                asyncio.run(repo.try_charge("ctx_" + "0" * 24, 0.1))
        assert asyncio.run(repo.try_charge("ctx_" + "0" * 24, 0.1)) is None  # no such row
    finally:
        repo.dispose()


@pytest.mark.slow
def test_two_processes_on_sqlite_never_overspend(tmp_path: Path, start_server: Any) -> None:
    two_processes_never_overspend(start_server, f"sqlite:///{tmp_path / 'two.db'}")


@pytest.mark.slow
def test_request_benchmark_runs_in_quick_mode() -> None:
    # Mechanics only (two servers, interleaved rounds, ratios printed): a timed assertion
    # would not be a benchmark. HEAD as the baseline exists in every git checkout.
    if subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True
    ).returncode:
        pytest.skip("not a git checkout: the benchmark's baseline is a git revision")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "http_load.py"), "--quick", "--baseline", "HEAD"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for line in ("requests/s, lean / before:", "CPU per request", "SQLite p99"):
        assert line in out.stdout, out.stdout


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.long
def test_ledger_benchmark_runs_every_charge_path_in_quick_mode() -> None:
    # Mechanics only: the three charge paths of this checkout (one transaction per charge,
    # group commit, group commit in two worker processes) on SQLite and PostgreSQL, each at
    # concurrency 1 and 4, their ratios printed with the load beside.
    reason = _pg_available()
    if reason:
        pytest.skip(reason)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "http_load.py"),
            "--ledger",
            "--quick",
            "--workers=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for db in ("sqlite", "postgresql"):
        for path in ("single", "group", "group, 2 workers"):
            assert re.search(rf"{db}, {path} +\d+ +\d+ +x\d", out.stdout), (db, path, out.stdout)
    assert "load average" in out.stdout
