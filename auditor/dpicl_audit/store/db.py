"""Where the trial log lives: ``--db`` as a SQLAlchemy URL, and the engine that opens it
(:class:`~dpicl_audit.store.TrialStore` keeps the tables and what is written to them).

A bare path is a SQLite file (its directory is created; WAL, so that ``dpicl-audit list``
and reports read while a run writes, and a 60 s busy timeout, so that a second writer waits
rather than fails). Any other URL is taken as is (``postgresql+psycopg://user@host/db``),
with ``schema`` placing the tables in a PostgreSQL schema. Errors name the URL with its
password hidden.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpicl_audit.errors import InvalidAuditInput

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

# SQLAlchemy is imported inside the functions: the CLI reads DEFAULT_DB (and checks --db)
# when it starts, and `dpicl-audit --help` must not pay SQLAlchemy's import (~1 s).

__all__ = ["DEFAULT_DB", "open_engine", "resolve_db_url", "shown_url", "sqlite_file_missing"]

DEFAULT_DB = "sqlite:///runs/audit.db"


def resolve_db_url(db: str | Path | None) -> str:
    """A SQLAlchemy URL from ``--db``: a URL as is, a bare path as a SQLite file."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if db is None:
        db = DEFAULT_DB
    text = str(db)
    if "://" not in text:
        text = f"sqlite:///{text}"
    try:
        make_url(text)
    except ArgumentError as exc:
        raise InvalidAuditInput(f"--db {text!r} is not a database URL: {exc}") from exc
    return text


def shown_url(url: str) -> str:
    """``url`` as an error message may show it (password hidden)."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def sqlite_file_missing(db: str | Path | None) -> str | None:
    """The path of a SQLite trial log that does not exist yet (None for one that exists, an
    in-memory database or another backend): readers check this so as not to create it."""
    from sqlalchemy.engine import make_url

    url = make_url(resolve_db_url(db))
    path = url.database
    if url.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    return None if Path(path).expanduser().exists() else path


def open_engine(url: str, schema: str | None) -> Engine:
    """The engine of a resolved URL (:func:`resolve_db_url`); a SQLite file's directory is
    created, and a path that cannot hold the file is an :class:`InvalidAuditInput`."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.engine import make_url

    sa_url = make_url(url)
    dialect = sa_url.get_backend_name()
    if schema is not None and dialect == "sqlite":
        raise InvalidAuditInput("schema= is for PostgreSQL; SQLite files have none")
    kwargs: dict[str, Any] = {"future": True}
    if dialect == "sqlite":
        path = sa_url.database
        if path and path != ":memory:":
            file = Path(path).expanduser()
            if file.is_dir():
                raise InvalidAuditInput(
                    f"--db {shown_url(url)!r} is a directory; give a SQLite file in it, e.g. "
                    f"{str(file / 'audit.db')!r}"
                )
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InvalidAuditInput(
                    f"--db {shown_url(url)!r}: cannot create its directory ({exc.strerror})"
                ) from exc
        kwargs["connect_args"] = {"timeout": 60}
    else:
        kwargs["pool_pre_ping"] = True
    engine: Engine = create_engine(url, **kwargs)
    if dialect == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    if schema is not None:
        engine = engine.execution_options(schema_translate_map={None: schema})
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets `dpicl-audit list` and report read while a run writes; busy_timeout makes a
    # second writer wait instead of failing.
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=60000")
    finally:
        cur.close()
