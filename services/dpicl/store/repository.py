"""Data access for contexts and their ledger columns.

SQLAlchemy's synchronous engine, run on two small thread pools of its own (reads, writes),
apart from the engine's threads, so a stuck database can neither block the event loop nor
starve other requests; every statement waits at most ``timeout_s`` for a lock. Any database
failure becomes :class:`~dpicl.errors.StorageUnavailable` (503), logged without its bound
parameters (``hide_parameters=True``): they hold private exemplars.

Charging is a single conditional UPDATE, which both SQLite (a database-wide write lock)
and PostgreSQL (a row lock, re-evaluating the WHERE clause after it) execute atomically:
concurrent charges from any number of processes can never overspend.

The request path is lean (issue 13): the charge is one prebuilt statement with bound
parameters (built once, compiled once by SQLAlchemy's cache), run on a Core connection,
and returns the ledger after the charge; a query takes the context's immutable fields
from an in-process cache (:mod:`dpicl.store.context_cache`), so a steady-state answer
costs one database round trip. On SQLite this process's writes take a lock per database
file first: two of its charges then never meet in SQLite's busy handler, whose sleeps
(up to 100 ms) made the tail latency.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Table,
    and_,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    func,
    make_url,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from dpicl.errors import StorageUnavailable
from dpicl.store.charges import (
    Charged,
    ChargeRequest,
    ChargeStatements,
    Refused,
    Rollback,
    record_refusal,
)
from dpicl.store.charges import charge as charge_tx
from dpicl.store.charges import refund as refund_tx
from dpicl.store.context_cache import ContextCache
from dpicl.store.deadline import CallAborted, DbCall, once_more_if_stale, run_with_deadline
from dpicl.store.keys import INTERNAL, Principal
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
    tenant: str | None = None

    @classmethod
    def from_row(
        cls, row: ContextRow | Any, *, exemplars: tuple[tuple[str, str], ...] | None = None
    ) -> StoredContext:
        """From a stored row (an ORM ``ContextRow`` or a selected row with its columns);
        ``exemplars`` given replaces the row's (a listing selects none)."""
        return cls(
            id=row.id,
            name=row.name,
            task=row.task,
            labels=tuple(row.labels),
            exemplars=exemplars
            if exemplars is not None
            else tuple((e["input"], e["output"]) for e in row.exemplars),
            template=row.template,
            mechanism=dict(row.mechanism),
            budget=dict(row.budget) if row.budget is not None else None,
            mu2_spent=row.mu2_spent,
            mu2_max=row.mu2_max,
            queries=row.queries,
            max_queries=row.max_queries,
            created_at=_utc(row.created_at),
            tenant=row.tenant,
        )


def _utc(at: datetime) -> datetime:
    # SQLite keeps no offset; every timestamp is written in UTC (models._now).
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


#: Where a page of contexts ends: (created_at, id), the listing's order.
ContextKey = tuple[datetime, str]


@dataclass(frozen=True)
class ListedContext:
    """A context as listed: its ``context`` has every field but the exemplars (an empty
    tuple), which a listing never shows; a page of contexts holding megabytes of exemplars
    each would otherwise load them all. Never charge or query through it."""

    context: StoredContext
    n_exemplars: int

    @classmethod
    def from_listing(cls, row: Any) -> ListedContext:
        ctx = StoredContext.from_row(row, exemplars=())
        return cls(context=ctx, n_exemplars=int(row.n_exemplars))


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


def new_context_id() -> str:
    return "ctx_" + secrets.token_hex(12)


_CONTEXT_ID = re.compile(r"ctx_[0-9a-f]{24}")


def is_context_id(value: str) -> bool:
    """Whether ``value`` can name a context; anything else is looked up nowhere."""
    return _CONTEXT_ID.fullmatch(value) is not None


_ROWS = cast(Table, ContextRow.__table__)
_MU2 = bindparam("mu2", type_=Float)

#: The charge, built once: bound parameters only, so every request reuses one compiled
#: statement. Both conditions and the increment are one UPDATE of one row (atomic; see the
#: module docstring); ``slack`` is 1 + the relative tolerance of the budget's mu^2.
CHARGE = (
    update(_ROWS)
    .where(
        _ROWS.c.id == bindparam("cid"),
        _ROWS.c.mu2_max.is_(None)
        | (_ROWS.c.mu2_spent + _MU2 <= _ROWS.c.mu2_max * bindparam("slack", type_=Float)),
        _ROWS.c.max_queries.is_(None) | (_ROWS.c.queries < _ROWS.c.max_queries),
    )
    .values(mu2_spent=_ROWS.c.mu2_spent + _MU2, queries=_ROWS.c.queries + 1)
    .returning(_ROWS.c.mu2_spent, _ROWS.c.queries)
)

#: Undo a charge whose answer was never released, never below zero.
REFUND = (
    update(_ROWS)
    .where(_ROWS.c.id == bindparam("cid"))
    .values(
        mu2_spent=case((_ROWS.c.mu2_spent > _MU2, _ROWS.c.mu2_spent - _MU2), else_=0.0),
        queries=case((_ROWS.c.queries > 0, _ROWS.c.queries - 1), else_=0),
    )
)

#: The listing: every column but the exemplars, whose number the database counts
#: (json_array_length: the same function in SQLite and PostgreSQL), in creation order.
LISTING = select(
    *(c for c in _ROWS.c if c.name != "exemplars"),
    func.json_array_length(_ROWS.c.exemplars).label("n_exemplars"),
).order_by(_ROWS.c.created_at, _ROWS.c.id)

#: The client-side deadline is DPICL_DB_TIMEOUT_S plus this: the database's own timeouts
#: (lock, statement, busy, pool checkout: all DPICL_DB_TIMEOUT_S) answer first when they can,
#: with their more certain message ("nothing was changed"); the deadline catches the rest.
DEADLINE_GRACE_S = 0.25

#: What a call that missed its deadline answers: it may have committed (a charge then stays
#: spent, docs/privacy.md), and nothing that depended on it is released.
_TIMED_OUT = (
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


class ContextRepository:
    """Contexts and the ledger columns, with atomic charge and refund."""

    def __init__(
        self,
        url: str,
        *,
        rtol: float = 0.0,
        timeout_s: float = 30.0,
        threads: int = 8,
        cache_bytes: int = 64 * 2**20,
        serialize_sqlite_writes: bool = True,
    ) -> None:
        self.url = url
        self.engine = make_engine(url, timeout_s=timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._rtol = rtol
        self._timeout_s = timeout_s
        self._write_lock = sqlite_write_lock(url) if serialize_sqlite_writes else None
        self.cache = ContextCache(cache_bytes)
        self._charges = ChargeStatements(self.engine.url.get_backend_name(), CHARGE, REFUND)
        # Separate pools: writers queued behind a held SQLite write lock cannot delay reads.
        self._reads = ThreadPoolExecutor(threads, thread_name_prefix="dpicl-db-read")
        self._writes = ThreadPoolExecutor(threads, thread_name_prefix="dpicl-db-write")

    def migrate(self) -> None:
        """Bring the schema to the newest revision (safe with many processes at once)."""
        from dpicl.store.migrations import upgrade

        try:
            upgrade(self.engine)
        except SQLAlchemyError as exc:
            # The operator's own setting, named so a wrong path is found (password hidden);
            # the error itself by class and SQLSTATE only, as everywhere.
            where = self.engine.url.render_as_string(hide_password=True)
            raise StorageUnavailable(
                f"cannot migrate the database schema at {where} ({describe_db_error(exc)})"
            ) from None

    def create_schema(self) -> None:
        """Alias of :meth:`migrate` (the schema is owned by the Alembic migrations)."""
        self.migrate()

    async def ping(self) -> None:
        """Raise :class:`StorageUnavailable` unless the database answers (readiness)."""

        def fn(s: Session) -> None:
            s.execute(text("SELECT 1"))

        await self._run(fn, op="ping")

    async def schema_revision(self) -> str | None:
        """The Alembic revision the database is at (None: no schema), within the deadline."""

        def fn(conn: Connection) -> str | None:
            from dpicl.store.migrations import current

            return current(conn)

        return await self._run_core(fn, op="schema_revision")

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
            if not lock.acquire(timeout=self._timeout_s):
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
                raise StorageUnavailable(_TIMED_OUT) from None
            log.warning("database error: %s", describe_db_error(exc))
            if call.committing:
                raise StorageUnavailable(
                    "the database failed while committing; the outcome is unknown (a charge "
                    "that may have been made stays spent), retry later"
                ) from None
            raise StorageUnavailable(
                "the database is unavailable or busy; nothing was changed or charged, retry later"
            ) from None

    async def _run(
        self, fn: Callable[[Session], T], *, write: bool = False, op: str = "other"
    ) -> T:
        pool = self._writes if write else self._reads
        try:
            work = functools.partial(self._call, fn, write)
            return await run_with_deadline(pool, work, self._timeout_s + DEADLINE_GRACE_S, op)
        except TimeoutError:
            raise StorageUnavailable(_TIMED_OUT) from None

    async def _run_core(
        self, fn: Callable[[Connection], T], *, write: bool = False, op: str = "other"
    ) -> T:
        pool = self._writes if write else self._reads
        try:
            work = functools.partial(self._call_core, fn, write)
            return await run_with_deadline(pool, work, self._timeout_s + DEADLINE_GRACE_S, op)
        except TimeoutError:
            raise StorageUnavailable(_TIMED_OUT) from None

    async def run(self, fn: Callable[[Connection], T], *, write: bool = False) -> T:
        """Run ``fn`` in one transaction on this repository's pools (the key store's
        statements, :mod:`dpicl.store.keys`), with every guard of the repository's own."""
        return await self._run_core(fn, write=write, op="keys")

    async def add(self, row: ContextRow) -> StoredContext:
        def fn(s: Session) -> StoredContext:
            s.add(row)
            s.flush()
            return StoredContext.from_row(row)

        return await self._run(fn, write=True, op="add")

    async def get(self, context_id: str) -> StoredContext | None:
        """The context as stored now (fresh ledger columns); refreshes the cache."""

        def fn(s: Session) -> StoredContext | None:
            row = s.get(ContextRow, context_id)
            return StoredContext.from_row(row) if row is not None else None

        ctx = await self._run(fn, op="get")
        if ctx is None:
            self.cache.evict(context_id)
        else:
            self.cache.put(ctx)
        return ctx

    async def get_for_query(self, context_id: str) -> StoredContext | None:
        """The context a query is about to be charged to: from the cache when it is there.

        Its ledger columns may be stale; only the charge's result may be shown. A context
        deleted meanwhile is refused by the charge itself (no row to update).
        """
        ctx = self.cache.get(context_id)
        return ctx if ctx is not None else await self.get(context_id)

    async def list_page(
        self, limit: int, after: ContextKey | None = None, *, principal: Principal
    ) -> tuple[list[ListedContext], ContextKey | None]:
        """Up to ``limit`` contexts that ``principal`` reaches (:meth:`Principal.reaches`)
        in creation order after ``after`` (keyset pagination on ``(created_at, id)``, served
        by their index), and the key of the last one when more follow (else None). A context
        created or deleted meanwhile moves no other one between pages. ``principal`` has no
        default: a listing that forgot it would list every context to any key."""
        stmt = LISTING.limit(limit + 1)
        if principal.kind == "key":
            # The same rule as Principal.reaches, as SQL.
            if principal.contexts is not None:
                stmt = stmt.where(_ROWS.c.id.in_(sorted(principal.contexts)))
            else:
                stmt = stmt.where(_ROWS.c.tenant == principal.tenant)
        if after is not None:
            at, cid = after
            stmt = stmt.where(
                or_(_ROWS.c.created_at > at, and_(_ROWS.c.created_at == at, _ROWS.c.id > cid))
            )

        def fn(conn: Connection) -> list[ListedContext]:
            return [ListedContext.from_listing(row) for row in conn.execute(stmt)]

        listed = await self._run_core(fn, write=False, op="list")
        if len(listed) <= limit:
            return listed, None
        last = listed[limit - 1].context
        return listed[:limit], (last.created_at, last.id)

    async def delete(self, context_id: str) -> bool:
        def fn(s: Session) -> bool:
            res = s.execute(delete(ContextRow).where(ContextRow.id == context_id))
            return bool(getattr(res, "rowcount", 0))

        self.cache.evict(context_id)
        return await self._run(fn, write=True, op="delete")

    def charge_request(
        self, context_id: str, principal: Principal, mu2: float, epsilon: float, delta: float
    ) -> ChargeRequest:
        return ChargeRequest(
            context_id=context_id,
            principal=principal,
            mu2=mu2,
            epsilon=epsilon,
            delta=delta,
            slack=1.0 + self._rtol,
        )

    async def charge(self, req: ChargeRequest) -> Charged | Refused:
        """Charge one query to its context and its key in one transaction, with its spend
        row (:mod:`dpicl.store.charges`); a refusal changes nothing."""

        def fn(conn: Connection) -> Charged:
            return charge_tx(conn, self._charges, req)

        try:
            return await self._run_core(fn, write=True, op="charge")
        except Rollback as exc:
            return exc.refused

    async def refund_charge(self, req: ChargeRequest, spend_id: int) -> None:
        """Undo a charge whose answer was never released (the engine failed)."""
        await self._run_core(
            lambda conn: refund_tx(conn, self._charges, req, spend_id), write=True, op="refund"
        )

    async def record_refusal(self, req: ChargeRequest) -> None:
        """A spend row saying ``req`` was refused (nothing was charged)."""
        await self._run_core(
            lambda conn: record_refusal(conn, self._charges, req), write=True, op="refusal"
        )

    async def try_charge(
        self, context_id: str, mu2: float, principal: Principal = INTERNAL
    ) -> tuple[float, int] | None:
        """Charge one query of cost ``mu2`` (epsilon and delta not recorded) if it fits.

        Returns the ledger after the charge, ``(mu2_spent, queries)``, or None when nothing
        was charged (a budget is exhausted or the context is gone).
        """
        out = await self.charge(self.charge_request(context_id, principal, mu2, 0.0, 0.0))
        return (out.mu2_spent, out.queries) if isinstance(out, Charged) else None

    def dispose(self) -> None:
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._writes.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()
