"""Data access for contexts and their ledger columns.

SQLAlchemy's synchronous engine, run in worker threads (``asyncio.to_thread``) so the event
loop stays free. Charging is a single conditional UPDATE, which both SQLite (a database-wide
write lock) and PostgreSQL (a row lock, re-evaluating the WHERE clause after it) execute
atomically: concurrent charges from any number of processes can never overspend.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, case, create_engine, delete, event, make_url, select, update
from sqlalchemy.orm import Session, sessionmaker

from dpicl.store.models import Base, ContextRow

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
            created_at=row.created_at,
        )


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # A generous busy timeout: several processes may share one SQLite file.
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


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


class ContextRepository:
    """Contexts and the ledger columns, with atomic charge and refund."""

    def __init__(self, url: str, *, rtol: float = 0.0) -> None:
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._rtol = rtol

    def create_schema(self) -> None:
        Base.metadata.create_all(self.engine)

    async def _run(self, fn: Callable[[Session], T]) -> T:
        def work() -> T:
            with self._sessions.begin() as session:
                return fn(session)

        return await asyncio.to_thread(work)

    async def add(self, row: ContextRow) -> StoredContext:
        def fn(s: Session) -> StoredContext:
            s.add(row)
            s.flush()
            return StoredContext.from_row(row)

        return await self._run(fn)

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

        return await self._run(fn)

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

        return await self._run(fn)

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
        await self._run(lambda s: s.execute(stmt))

    def dispose(self) -> None:
        self.engine.dispose()
