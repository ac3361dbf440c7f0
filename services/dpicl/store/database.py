"""The database under the store: its SQLAlchemy engine, sessions, thread pools and
deadlines, and the guards every call runs under.

SQLAlchemy's synchronous engine, run on two small thread pools of its own (reads, writes),
apart from the engine's threads, so a stuck database can neither block the event loop nor
starve other requests; every statement waits at most ``timeout_s`` for a lock, and every
call at most a little longer (:mod:`dpicl.store.deadline`). Any database failure becomes
:class:`~dpicl.errors.StorageUnavailable` (503), logged without its bound parameters
(``hide_parameters=True``): they hold private exemplars. On SQLite this process's writes
take a lock per database file first: two of its writes then never meet in SQLite's busy
handler, whose sleeps (up to 100 ms) made the tail latency.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from dpicl.errors import StorageUnavailable
from dpicl.store.deadline import CallAborted, DbCall, once_more_if_stale, run_with_deadline
from dpicl.store.migrations import revision_of, upgrade

__all__ = [
    "DEADLINE_GRACE_S",
    "Database",
    "describe_db_error",
    "make_engine",
    "sqlite_write_lock",
]

log = logging.getLogger("dpicl.store")

T = TypeVar("T")


def make_engine(url: str, *, timeout_s: float = 30.0) -> Engine:
    """An engine that never logs bound parameters and never waits longer than ``timeout_s``
    for a lock or a pooled connection."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # The busy timeout bounds how long a statement waits for another process's write.
        engine = create_engine(
            url,
            connect_args={"timeout": timeout_s, "check_same_thread": False},
            hide_parameters=True,
            pool_timeout=timeout_s,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        ms = int(timeout_s * 1000)
        connect_args = {
            # Connecting (TCP and the start-up exchange) gives up after this many seconds.
            "connect_timeout": max(1, math.ceil(timeout_s)),
            # The server's side: a statement or a lock wait past the deadline is cancelled,
            # and a transaction whose client went silent mid-way (a frozen network) is
            # rolled back rather than committed when the client's COMMIT arrives late.
            "options": f"-c lock_timeout={ms} -c statement_timeout={ms} "
            f"-c idle_in_transaction_session_timeout={ms}",
            # The kernel's side, for a peer that vanished: unacknowledged data and silent
            # idle connections are given up. The deadline that always holds is the
            # client's own (store/deadline.py).
            "tcp_user_timeout": ms,
            "keepalives": 1,
            "keepalives_idle": max(1, math.ceil(timeout_s)),
            "keepalives_interval": max(1, math.ceil(timeout_s / 3)),
            "keepalives_count": 3,
        }
    return create_engine(
        url,
        # No pre-ping: a ping is I/O before the call can be aborted (store/deadline.py); a
        # pooled connection found dead is retried once instead (ContextRepository._guarded).
        pool_pre_ping=False,
        pool_size=10,
        max_overflow=20,
        pool_timeout=timeout_s,
        hide_parameters=True,
        connect_args=connect_args,
    )


def describe_db_error(exc: BaseException) -> str:
    """Class names and SQLSTATE only: a driver's message may quote row values."""
    orig = getattr(exc, "orig", None)
    parts = [type(exc).__name__]
    if orig is not None:
        parts.append(type(orig).__name__)
        state = getattr(orig, "sqlstate", None)
        if state:
            parts.append(f"SQLSTATE {state}")
    return " / ".join(parts)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets readers proceed during a charge and needs one fsync per commit instead of
    # the rollback journal's several. synchronous stays FULL: a charge must survive a power
    # loss, since its answer is released as soon as it commits.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=FULL")
    cur.close()


#: The client-side deadline is DPICL_DB_TIMEOUT_S plus this: the database's own timeouts
#: (lock, statement, busy, pool checkout: all DPICL_DB_TIMEOUT_S) answer first when they can,
#: with their more certain message ("nothing was changed"); the deadline catches the rest.
DEADLINE_GRACE_S = 0.25

#: What a call that missed its deadline answers: it may have committed (a charge then stays
#: spent, docs/privacy.md), and nothing that depended on it is released.
TIMED_OUT = (
    "the database did not answer within DPICL_DB_TIMEOUT_S; nothing was released (a charge "
    "that may have reached the database stays spent), retry later"
)

# One lock per SQLite file, shared by every repository of this process on that file.
_SQLITE_WRITE_LOCKS: dict[str, threading.Lock] = {}
_SQLITE_WRITE_LOCKS_GUARD = threading.Lock()


def sqlite_write_lock(url: str) -> threading.Lock | None:
    """This process's write lock of a SQLite database (None for other back ends and for
    in-memory databases, which no other connection shares)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    key = str(Path(parsed.database).expanduser().resolve())
    with _SQLITE_WRITE_LOCKS_GUARD:
        return _SQLITE_WRITE_LOCKS.setdefault(key, threading.Lock())


class Database:
    """One database: its engine, sessions, pools and this process's SQLite write lock."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        threads: int = 8,
        serialize_sqlite_writes: bool = True,
    ) -> None:
        self.url = url
        self.engine = make_engine(url, timeout_s=timeout_s)
        self.backend: str = self.engine.url.get_backend_name()
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.timeout_s = timeout_s
        self._write_lock = sqlite_write_lock(url) if serialize_sqlite_writes else None
        # Separate pools: writers queued behind a held SQLite write lock cannot delay reads.
        self._reads = ThreadPoolExecutor(threads, thread_name_prefix="dpicl-db-read")
        self._writes = ThreadPoolExecutor(threads, thread_name_prefix="dpicl-db-write")

    def migrate(self) -> None:
        """Bring the schema to the newest revision (safe with many processes at once)."""

        try:
            upgrade(self.engine)
        except SQLAlchemyError as exc:
            # The operator's own setting, named so a wrong path is found (password hidden);
            # the error itself by class and SQLSTATE only, as everywhere.
            where = self.engine.url.render_as_string(hide_password=True)
            raise StorageUnavailable(
                f"cannot migrate the database schema at {where} ({describe_db_error(exc)})"
            ) from None

    async def ping(self) -> None:
        """Raise :class:`StorageUnavailable` unless the database answers (readiness)."""

        def fn(s: Session) -> None:
            s.execute(text("SELECT 1"))

        await self.run_session(fn, op="ping")

    async def schema_revision(self) -> str | None:
        """The Alembic revision the database is at (None: no schema), within the deadline."""

        def fn(conn: Connection) -> str | None:

            return revision_of(conn)

        return await self.run_core(fn, op="schema_revision")

    def _call(
        self, fn: Callable[[Session], T], write: bool = False, call: DbCall | None = None
    ) -> T:
        call = call or DbCall()

        def in_session() -> T:
            with self._sessions() as session:
                call.attach(session.connection().connection.dbapi_connection)
                try:
                    result = fn(session)
                    call.committing = True
                    session.commit()
                    return result
                finally:
                    call.detach()

        return self._guarded(in_session, write, call)

    def _call_core(
        self, fn: Callable[[Connection], T], write: bool = False, call: DbCall | None = None
    ) -> T:
        call = call or DbCall()

        def in_transaction() -> T:
            with self.engine.connect() as conn:
                call.attach(conn.connection.dbapi_connection)
                try:
                    with conn.begin():
                        result = fn(conn)
                        call.committing = True
                    return result
                finally:
                    call.detach()

        return self._guarded(in_transaction, write, call)

    def _guarded(self, work: Callable[[], T], write: bool, call: DbCall | None = None) -> T:
        call = call or DbCall()
        lock = self._write_lock if write else None
        try:
            if lock is None:
                return once_more_if_stale(work, call)
            # Bounded like every other wait for the database (DPICL_DB_TIMEOUT_S).
            t0 = time.monotonic()
            if not lock.acquire(timeout=self.timeout_s):
                log.warning("database error: this process's SQLite write queue timed out")
                raise StorageUnavailable(
                    f"the database stayed busy for {time.monotonic() - t0:.1f} s; nothing "
                    "was changed or charged, retry later"
                )
            try:
                return once_more_if_stale(work, call)
            finally:
                lock.release()
        except (SQLAlchemyError, CallAborted) as exc:
            if call.aborted:
                raise StorageUnavailable(TIMED_OUT) from None
            log.warning("database error: %s", describe_db_error(exc))
            if call.committing:
                raise StorageUnavailable(
                    "the database failed while committing; the outcome is unknown (a charge "
                    "that may have been made stays spent), retry later"
                ) from None
            raise StorageUnavailable(
                "the database is unavailable or busy; nothing was changed or charged, retry later"
            ) from None

    async def run_session(
        self, fn: Callable[[Session], T], *, write: bool = False, op: str = "other"
    ) -> T:
        """``fn`` in one ORM session (committed), on the read or write pool, under the
        guards and the deadline; ``op`` names the call in the metrics."""
        pool = self._writes if write else self._reads
        try:
            work = functools.partial(self._call, fn, write)
            return await run_with_deadline(pool, work, self.timeout_s + DEADLINE_GRACE_S, op)
        except TimeoutError:
            raise StorageUnavailable(TIMED_OUT) from None

    async def run_core(
        self, fn: Callable[[Connection], T], *, write: bool = False, op: str = "other"
    ) -> T:
        """``fn`` in one Core transaction (committed), like :meth:`run_session`."""
        pool = self._writes if write else self._reads
        try:
            work = functools.partial(self._call_core, fn, write)
            return await run_with_deadline(pool, work, self.timeout_s + DEADLINE_GRACE_S, op)
        except TimeoutError:
            raise StorageUnavailable(TIMED_OUT) from None

    def dispose(self) -> None:
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._writes.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()
