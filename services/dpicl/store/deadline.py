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

import logging
import os
import socket
import sqlite3
import threading
from typing import Any

__all__ = ["CallAborted", "DbCall"]

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
