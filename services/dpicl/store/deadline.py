"""A client-side deadline on one database call, enforced even when the database stops
answering on an open connection.

PostgreSQL's ``statement_timeout`` and ``lock_timeout`` are enforced by the server: a server
that is frozen, or a network path that silently drops everything, enforces nothing, and a
thread blocked reading from such a connection waits forever (issue 26 saw requests hang past
90 s with a 5 s timeout, then commit their charges when the database came back). So every
call runs under ``asyncio.timeout`` on the event loop's side, and when the deadline passes
the call is *aborted* from there: the socket of the connection it holds is shut down
(PostgreSQL; a SQLite connection is interrupted instead), so the blocked thread returns at
once with an error, the connection is discarded, and the database server sees the client
leave and rolls back whatever transaction it had open. A call still queued for a storage
thread is cancelled before it starts; one that starts after its deadline finds itself
aborted before it sends anything.

What an aborted call may have done: nothing, except when its COMMIT had reached the database
before the deadline; then it committed but nobody hears so. The caller treats that outcome
as unknown, and a charge of unknown outcome as spent (docs/privacy.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError

from dpicl.errors import ServerBusy
from dpicl.metrics import db_timer

__all__ = ["CallAborted", "DbCall", "once_more_if_stale", "run_with_deadline"]

T = TypeVar("T")

log = logging.getLogger("dpicl.store")


class CallAborted(Exception):
    """Raised in a storage thread whose call was aborted before it touched the database."""


class DbCall:
    """One database call: the storage thread attaches the DBAPI connection it holds, the
    event loop may abort it (see the module docstring). Attach, detach and abort take one
    lock, so an abort never reaches a connection that has gone back to the pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Any = None
        self.aborted = False
        #: Set by the storage thread once its work is done and its COMMIT is being sent:
        #: a failure from then on leaves the outcome unknown.
        self.committing = False

    def attach(self, dbapi_connection: Any) -> None:
        """In the storage thread, after checkout and before the first statement."""
        with self._lock:
            if self.aborted:
                raise CallAborted("the call's deadline passed before it started")
            self._conn = dbapi_connection

    def detach(self) -> None:
        with self._lock:
            self._conn = None

    def abort(self) -> None:
        """From the event loop: make the storage thread's blocked call return now."""
        with self._lock:
            self.aborted = True
            conn, self._conn = self._conn, None
            if conn is not None:
                _interrupt(conn)


def _interrupt(conn: Any) -> None:
    if isinstance(conn, sqlite3.Connection):
        conn.interrupt()  # the running statement fails with "interrupted"
        return
    pgconn = getattr(conn, "pgconn", None)  # psycopg 3
    fd = getattr(pgconn, "socket", -1) if pgconn is not None else -1
    if not isinstance(fd, int) or fd < 0:
        return
    try:
        # shutdown acts on the socket itself, not on one descriptor: the thread blocked
        # in poll/recv on psycopg's descriptor wakes up to an end of stream. The duplicate
        # is only ours to close.
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError as exc:  # already closed: nothing blocks on it
        log.debug("aborting a database call: %s", type(exc).__name__)


async def run_with_deadline(
    pool: Executor, work: Callable[[DbCall], T], timeout_s: float, op: str
) -> T:
    """Run ``work`` on ``pool`` and wait at most ``timeout_s``; past it, abort the call and
    raise ``TimeoutError`` (the caller answers 503). ``op`` names it in the metrics."""
    call = DbCall()
    # The thread runs in a copy of this task's context: what it logs (a database error)
    # carries the request's id (dpicl.logging_setup.REQUEST_ID), as every line of a request
    # must. run_in_executor, unlike asyncio.to_thread, copies nothing.
    context = contextvars.copy_context()
    try:
        future = asyncio.get_running_loop().run_in_executor(pool, context.run, work, call)
    except RuntimeError:
        # The pool could not start a thread (memory or the thread limit ran out): the
        # server's state, answered like a full server, and nothing ran.
        raise ServerBusy(
            "the server cannot start a storage thread now (memory or threads exhausted); "
            "nothing was charged, retry later"
        ) from None
    with db_timer(op):
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except asyncio.CancelledError:
            # Whoever awaited it is gone (a client, an outer timeout): nothing will use the
            # result, so the thread is not left blocked on a database that may not answer.
            call.abort()
            raise
        except TimeoutError:
            call.abort()  # cancelled above if still queued; aborted here if running
            log.warning(
                "database call %s missed its deadline of %s s (DPICL_DB_TIMEOUT_S)",
                op,
                timeout_s,
            )
            raise


def once_more_if_stale(work: Callable[[], T], call: DbCall) -> T:
    """Run ``work``; if its pooled connection turns out dead before anything could commit,
    run it once more on a fresh one."""
    try:
        return work()
    except DBAPIError as exc:
        # A pooled connection the server closed (a restart): SQLAlchemy discarded it and
        # the pool's older ones. No COMMIT was sent, so nothing was committed.
        if not exc.connection_invalidated or call.aborted or call.committing:
            raise
        log.info("database connection was stale; retrying once on a fresh one")
        return work()
