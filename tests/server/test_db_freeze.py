"""A database that stops answering (issue 26): a real ``dpicl serve`` process talks to
PostgreSQL through a TCP proxy of this test's own, which stops forwarding mid-load (both
ways, connections left open: what a frozen server or a silent network partition looks like
from the client). Requests must get 503 ``storage_unavailable`` within the deadline
(DPICL_DB_TIMEOUT_S), nothing may be charged after the freeze ends (no late charges: a
charge whose client gave up must not commit when the database comes back), every answer the
client received must be charged, and the server must serve again once the proxy resumes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.conftest import admin_headers, free_port, user_headers
from tests.server.api_helpers import voting_context

DEADLINE_S = 1.0
#: A 503 may arrive this much after the deadline: the event loop's scheduling and the
#: HTTP round trip on a loaded 2-core machine.
SLACK_S = 1.5


class FreezableProxy:
    """A TCP proxy to ``upstream`` on its own event loop thread; :meth:`freeze` stops it
    reading from either side (bytes already sent wait in the kernel's buffers, as they would
    at a frozen server), :meth:`thaw` lets everything through again."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.flowing = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None

    def __enter__(self) -> FreezableProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.thaw()
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _start(self) -> None:
        self.flowing.set()
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await self.flowing.wait()
            data = await reader.read(65536)
            await self.flowing.wait()  # read just before a freeze: held until the thaw
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    def freeze(self) -> None:
        self.loop.call_soon_threadsafe(self.flowing.clear)

    def thaw(self) -> None:
        self.loop.call_soon_threadsafe(self.flowing.set)


@pytest.fixture
def frozen_db_server(
    pg_url: str, start_server: Any
) -> Iterator[tuple[Any, FreezableProxy, sa.Engine]]:
    url = sa.make_url(pg_url)
    with FreezableProxy((url.host or "127.0.0.1", url.port or 5432)) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port)
        srv = start_server(
            {
                "DPICL_ENGINE": "oracle",
                "DPICL_DATABASE_URL": proxied.render_as_string(hide_password=False),
                "DPICL_DB_TIMEOUT_S": str(DEADLINE_S),
                "DPICL_DB_THREADS": "4",
            }
        )
        direct = sa.create_engine(pg_url)  # the test's own view, around the proxy
        try:
            yield srv, proxy, direct
        finally:
            direct.dispose()


def charged(direct: sa.Engine, cid: str) -> int:
    with direct.connect() as conn:
        q = sa.text("SELECT queries FROM dpicl_contexts WHERE id = :cid")
        return int(conn.execute(q, {"cid": cid}).scalar_one())


@pytest.mark.postgres
def test_frozen_database_gets_503_within_the_deadline_and_no_late_charge(
    frozen_db_server: tuple[Any, FreezableProxy, sa.Engine],
) -> None:
    srv, proxy, direct = frozen_db_server
    body = voting_context()  # unbudgeted: every answer is one charge, counted by the DB
    with httpx.Client(base_url=srv.url, timeout=30) as h:
        cid = h.post("/v1/contexts", json=body, headers=admin_headers()).json()["id"]
        for _ in range(3):  # the context is now in the server's cache
            q = {"context_id": cid, "query": "warm"}
            assert h.post("/v1/classify", json=q, headers=user_headers()).status_code == 200

    results: list[tuple[float, float, int, str]] = []  # sent, answered, status, code
    stop = asyncio.Event()

    async def worker(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            r = await client.post(
                "/v1/classify", json={"context_id": cid, "query": "load"}, headers=user_headers()
            )
            # The code and the Retry-After it came with (issue 47: the storage deadline).
            code = (
                f"{r.json()['error']['code']} {r.headers.get('retry-after')}"
                if r.status_code != 200
                else ""
            )
            results.append((t0, time.monotonic(), r.status_code, code))

    async def load() -> tuple[float, float]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            tasks = [asyncio.create_task(worker(client)) for _ in range(12)]
            await asyncio.sleep(0.7)
            proxy.freeze()
            frozen_at = time.monotonic()
            await asyncio.sleep(3 * DEADLINE_S)
            ready = await client.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.headers["retry-after"] == "1"
            stop.set()
            await asyncio.gather(*tasks)  # every request in flight gets its answer
            return frozen_at, time.monotonic()

    frozen_at, drained_at = asyncio.run(load())
    at_freeze_end = charged(direct, cid)  # read around the proxy, still frozen
    answered = 3 + sum(1 for _, _, status, _ in results if status == 200)
    refused = [r for r in results if r[2] != 200]
    assert refused, "no request met the frozen database"
    # Retry-After: DPICL_DB_TIMEOUT_S (1 s), when a retry may find the database again.
    assert {(s, c) for _, _, s, c in refused} == {(503, "storage_unavailable 1")}, refused
    # Within the deadline: nothing sent during the freeze waited much past it.
    late = [(t1 - t0) for t0, t1, _, _ in results if t0 >= frozen_at]
    assert late and max(late) < DEADLINE_S + SLACK_S, max(late)
    assert drained_at - frozen_at < 3 * DEADLINE_S + DEADLINE_S + SLACK_S

    proxy.thaw()
    time.sleep(3 * DEADLINE_S)  # anything held in the proxy's buffers arrives now
    after_thaw = charged(direct, cid)
    # No late charge: what the database held at the end of the freeze is all it ever held.
    assert after_thaw == at_freeze_end, (at_freeze_end, after_thaw)
    # No answer uncharged; a charge whose outcome the server could not learn (its COMMIT
    # reached the database, the reply did not come back) counts as spent: at most one per
    # refused request.
    assert answered <= after_thaw <= answered + len(refused), (answered, after_thaw)

    with httpx.Client(base_url=srv.url, timeout=30) as h:
        # The server serves again on fresh connections.
        deadline = time.monotonic() + 10
        while h.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "not ready again after the thaw"
            time.sleep(0.2)
        q = {"context_id": cid, "query": "after"}
        assert h.post("/v1/classify", json=q, headers=user_headers()).status_code == 200
    assert charged(direct, cid) == after_thaw + 1


def test_abort_interrupts_a_sqlite_statement(tmp_path: Path) -> None:
    """The deadline's abort on SQLite: the running statement is interrupted at once."""
    import sqlite3

    from dpicl.store.deadline import DbCall

    conn = sqlite3.connect(tmp_path / "x.db", check_same_thread=False)
    call = DbCall()
    call.attach(conn)
    threading.Timer(0.3, call.abort).start()
    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        # A statement that runs for minutes unless interrupted.
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
        ).fetchall()
    assert time.monotonic() - t0 < 5
    assert call.aborted
    with pytest.raises(Exception, match="deadline"):
        call.attach(conn)  # an aborted call never starts again
    conn.close()
