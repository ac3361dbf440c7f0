"""Schema migrations (Alembic), run by every server process on start.

Many processes may start at once on one database, so the upgrade runs under a lock that only
one of them holds at a time: a PostgreSQL advisory lock, for a SQLite file a lock file in
this user's temporary directory named after the file's absolute path (not beside it: the
default database is ``./dpicl.db``, and the lock was left in the working directory).
The others wait, then find the schema at head and do nothing. A database created before the
migrations existed (by ``create_all``, same schema as revision 0001) is adopted by stamping
it at 0001, without touching its rows.

Add a revision: write ``versions/NNNN_<what>.py`` with ``down_revision`` the current head.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from filelock import FileLock
from sqlalchemy import Connection, Engine, inspect, text

__all__ = ["BASELINE", "head", "upgrade"]

#: The revision whose schema ``create_all`` used to build.
BASELINE = "0001"
#: Arbitrary constant key of the PostgreSQL advisory lock ("dpicl" in ASCII).
_PG_LOCK_KEY = 0x647069636C
_TABLE = "dpicl_contexts"
#: How long a starting process waits for another's migration (and a migration may run).
_MIGRATION_WAIT_S = 300


def _config(connection: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def head() -> str:
    """The newest revision (read from the scripts once per process)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent))
    rev = ScriptDirectory.from_config(cfg).get_current_head()
    assert rev is not None
    return rev


def sqlite_lock_path(database: str) -> Path:
    """Where the processes migrating the SQLite file ``database`` take turns: one lock file
    per file (its absolute path, hashed) and per user (another user's lock file could not
    be opened), in the temporary directory, which also holds no stale lock after a reboot."""
    where = str(Path(database).expanduser().resolve())
    digest = hashlib.sha256(where.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"dpicl-migrate-{uid}-{digest}.lock"


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    backend = engine.url.get_backend_name()
    if backend == "sqlite":
        path = engine.url.database
        lock: contextlib.AbstractContextManager[object] = (
            FileLock(str(sqlite_lock_path(path)), timeout=_MIGRATION_WAIT_S)
            if path and path != ":memory:"
            else contextlib.nullcontext()
        )
        with lock, engine.connect() as conn:
            yield conn
        return
    with engine.connect() as conn:
        if backend == "postgresql":
            # The request path's short lock and statement timeouts would make a process that
            # waits for another's migration give up; waiting (boundedly) is right here.
            conn.execute(text(f"SET lock_timeout = '{_MIGRATION_WAIT_S}s'"))
            conn.execute(text(f"SET statement_timeout = '{_MIGRATION_WAIT_S}s'"))
            # Session-level: held across the migration's own commits, released below.
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
        try:
            yield conn
        finally:
            if backend == "postgresql":
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.execute(text("RESET lock_timeout"))
                conn.execute(text("RESET statement_timeout"))
                conn.commit()


def current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def revision_of(connection: Connection) -> str | None:
    """The revision the database is at (None: no schema), read from Alembic's table
    directly: :func:`current` builds a MigrationContext, which logs two INFO lines each
    time, and ``/readyz`` asks on every probe."""
    if not connection.dialect.has_table(connection, "alembic_version"):
        return None
    rows = [r[0] for r in connection.execute(text("SELECT version_num FROM alembic_version"))]
    return "+".join(sorted(rows)) if rows else None


def upgrade(engine: Engine) -> None:
    """Migrate ``engine``'s database to head, adopting a pre-migration database first."""
    with _migration_lock(engine) as conn:
        cfg = _config(conn)
        tables = set(inspect(conn).get_table_names())
        if _TABLE in tables and "alembic_version" not in tables:
            command.stamp(cfg, BASELINE)
            conn.commit()
        if current(conn) != head():
            command.upgrade(cfg, "head")
        conn.commit()
