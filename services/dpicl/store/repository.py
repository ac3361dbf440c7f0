"""Data access for contexts and their ledger columns.

SQLAlchemy's synchronous engine, run on two small thread pools of its own (reads, writes),
apart from the engine's threads, so a stuck database can neither block the event loop nor
starve other requests; every statement waits at most ``timeout_s`` for a lock. Any database
failure becomes :class:`~dpicl.errors.StorageUnavailable` (503), logged without its bound
parameters (``hide_parameters=True``): they hold private exemplars.

Charging is a single conditional UPDATE, which both SQLite (a database-wide write lock)
and PostgreSQL (a row lock, re-evaluating the WHERE clause after it) execute atomically:
concurrent charges from any number of processes can never overspend.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Engine,
    case,
    create_engine,
    delete,
    event,
    make_url,
    select,
    text,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from dpicl.errors import StorageUnavailable
from dpicl.store.models import ContextRow

log = logging.getLogger("dpicl.store")

T = TypeVar("T")


@dataclass(frozen=True)
class StoredContext:
    """A context as read from the store (a detached, immutable snapshot)."""

    id: str
    name: str | None
    task: str
    labels: tuple[str, ...]
    exemplars: tuple[tuple[str, str], ...]
    template: str
    mechanism: dict[str, Any]
    budget: dict[str, float] | None
    mu2_spent: float
    mu2_max: float | None
    queries: int
    max_queries: int | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: ContextRow) -> StoredContext:
        return cls(
            id=row.id,
            name=row.name,
            task=row.task,
            labels=tuple(row.labels),
            exemplars=tuple((e["input"], e["output"]) for e in row.exemplars),
            template=row.template,
            mechanism=dict(row.mechanism),
            budget=dict(row.budget) if row.budget is not None else None,
            mu2_spent=row.mu2_spent,
            mu2_max=row.mu2_max,
            queries=row.queries,
            max_queries=row.max_queries,
            # SQLite keeps no offset; every timestamp is written in UTC (models._now).
            created_at=row.created_at
            if row.created_at.tzinfo is not None
            else row.created_at.replace(tzinfo=UTC),
        )


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
            "connect_timeout": max(1, math.ceil(timeout_s)),
            "options": f"-c lock_timeout={ms} -c statement_timeout={ms}",
        }
    return create_engine(
        url,
        pool_pre_ping=True,
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


def new_context_id() -> str:
    return "ctx_" + secrets.token_hex(12)


_CONTEXT_ID = re.compile(r"ctx_[0-9a-f]{24}")


def is_context_id(value: str) -> bool:
    """Whether ``value`` can name a context; anything else is looked up nowhere."""
    return _CONTEXT_ID.fullmatch(value) is not None


class ContextRepository:
    """Contexts and the ledger columns, with atomic charge and refund."""

    def __init__(
        self, url: str, *, rtol: float = 0.0, timeout_s: float = 30.0, threads: int = 8
    ) -> None:
        self.url = url
        self.engine = make_engine(url, timeout_s=timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._rtol = rtol
        # Separate pools: writers queued behind a held SQLite write lock cannot delay reads.
        self._reads = ThreadPoolExecutor(threads, thread_name_prefix="dpicl-db-read")
        self._writes = ThreadPoolExecutor(threads, thread_name_prefix="dpicl-db-write")

    def migrate(self) -> None:
        """Bring the schema to the newest revision (safe with many processes at once)."""
        from dpicl.store.migrations import upgrade

        try:
            upgrade(self.engine)
        except SQLAlchemyError as exc:
            raise StorageUnavailable(
                f"cannot migrate the database schema ({describe_db_error(exc)})"
            ) from None

    def create_schema(self) -> None:
        """Alias of :meth:`migrate` (the schema is owned by the Alembic migrations)."""
        self.migrate()

    async def ping(self) -> None:
        """Raise :class:`StorageUnavailable` unless the database answers (readiness)."""

        def fn(s: Session) -> None:
            s.execute(text("SELECT 1"))

        await self._run(fn)

    def _call(self, fn: Callable[[Session], T]) -> T:
        try:
            with self._sessions.begin() as session:
                return fn(session)
        except SQLAlchemyError as exc:
            log.warning("database error: %s", describe_db_error(exc))
            raise StorageUnavailable(
                "the database is unavailable or busy; nothing was changed or charged, retry later"
            ) from None

    async def _run(self, fn: Callable[[Session], T], *, write: bool = False) -> T:
        pool = self._writes if write else self._reads
        return await asyncio.get_running_loop().run_in_executor(pool, self._call, fn)

    async def add(self, row: ContextRow) -> StoredContext:
        def fn(s: Session) -> StoredContext:
            s.add(row)
            s.flush()
            return StoredContext.from_row(row)

        return await self._run(fn, write=True)

    async def get(self, context_id: str) -> StoredContext | None:
        def fn(s: Session) -> StoredContext | None:
            row = s.get(ContextRow, context_id)
            return StoredContext.from_row(row) if row is not None else None

        return await self._run(fn)

    async def list(self) -> list[StoredContext]:
        def fn(s: Session) -> list[StoredContext]:
            rows = s.scalars(select(ContextRow).order_by(ContextRow.created_at, ContextRow.id))
            return [StoredContext.from_row(r) for r in rows]

        return await self._run(fn)

    async def delete(self, context_id: str) -> bool:
        def fn(s: Session) -> bool:
            res = s.execute(delete(ContextRow).where(ContextRow.id == context_id))
            return bool(getattr(res, "rowcount", 0))

        return await self._run(fn, write=True)

    async def try_charge(self, context_id: str, mu2: float) -> tuple[float, int] | None:
        """Charge one query of cost ``mu2`` if it fits the budget.

        Returns the ledger after the charge, ``(mu2_spent, queries)``, or None when nothing
        was charged (the budget is exhausted or the context is gone).
        """
        c = ContextRow
        fits_mu2 = (c.mu2_max.is_(None)) | (c.mu2_spent + mu2 <= c.mu2_max * (1.0 + self._rtol))
        fits_queries = (c.max_queries.is_(None)) | (c.queries < c.max_queries)
        stmt = (
            update(c)
            .where(c.id == context_id, fits_mu2, fits_queries)
            .values(mu2_spent=c.mu2_spent + mu2, queries=c.queries + 1)
            .returning(c.mu2_spent, c.queries)
            .execution_options(synchronize_session=False)
        )

        def fn(s: Session) -> tuple[float, int] | None:
            row = s.execute(stmt).first()
            return (float(row[0]), int(row[1])) if row is not None else None

        return await self._run(fn, write=True)

    async def refund(self, context_id: str, mu2: float) -> None:
        """Undo a charge whose answer was never released (the engine failed)."""
        c = ContextRow
        stmt = (
            update(c)
            .where(c.id == context_id)
            .values(
                mu2_spent=case((c.mu2_spent > mu2, c.mu2_spent - mu2), else_=0.0),
                queries=case((c.queries > 0, c.queries - 1), else_=0),
            )
            .execution_options(synchronize_session=False)
        )
        await self._run(lambda s: s.execute(stmt), write=True)

    def dispose(self) -> None:
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._writes.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()
