"""Contexts in the database: the repository the pipelines, the routes and the ledger use.

:class:`ContextRepository` puts together what lives in modules of their own:

* the database, its pools, guards and deadlines: :mod:`dpicl.store.database`;
* the contexts as handed out (:class:`StoredContext`, :class:`ListedContext`) and their
  ids: :mod:`dpicl.store.records`; their immutable fields cached per process:
  :mod:`dpicl.store.context_cache`;
* a charge's SQL (the key's row, the context's conditional UPDATE, the spend row):
  :mod:`dpicl.store.charges`; concurrent charges grouped into one transaction:
  :mod:`dpicl.store.group_commit`.

Here: adding, reading, listing and deleting contexts, and the ledger's calls (charge,
refund, refusal). Charging is a conditional UPDATE, which both SQLite (a database-wide
write lock) and PostgreSQL (a row lock, re-evaluating the WHERE clause after it) execute
atomically: concurrent charges from any number of processes can never overspend.

The request path is lean (issue 13): the charge is prebuilt statements with bound
parameters (built once, compiled once by SQLAlchemy's cache), run on a Core connection,
returning the ledger after the charge; a query takes the context's immutable fields from
the context cache, so a steady-state answer costs one database round trip (shared with the
other charges of its group under concurrency).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from sqlalchemy import (
    Connection,
    Table,
    TextualSelect,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from dpicl.store.charges import (
    CHARGE,
    Charged,
    ChargeRequest,
    ChargeStatements,
    Refused,
    record_refusal,
)
from dpicl.store.charges import refund as refund_tx
from dpicl.store.context_cache import ContextCache
from dpicl.store.database import Database, make_engine, sqlite_write_lock
from dpicl.store.group_commit import GroupCommit
from dpicl.store.keys import INTERNAL, Principal
from dpicl.store.models import ContextRow
from dpicl.store.records import (
    ContextKey,
    ListedContext,
    StoredContext,
    is_context_id,
    new_context_id,
)

# Where they were before the split (the ledger, routes, pipelines and tests import them here).
__all__ = [
    "CHARGE",
    "ContextKey",
    "ContextRepository",
    "ListedContext",
    "StoredContext",
    "is_context_id",
    "make_engine",
    "new_context_id",
    "sqlite_write_lock",
]

T = TypeVar("T")

_ROWS = cast(Table, ContextRow.__table__)

#: The listing: every column but the exemplars, whose number the database counts
#: (json_array_length: the same function in SQLite and PostgreSQL), in creation order.
LISTING = select(
    *(c for c in _ROWS.c if c.name != "exemplars"),
    func.json_array_length(_ROWS.c.exemplars).label("n_exemplars"),
).order_by(_ROWS.c.created_at, _ROWS.c.id)


#: Every column but the exemplars: what a context's metadata needs (``GET /v1/models/{id}``).
_INFO_COLUMNS = [c for c in _ROWS.c if c.name != "exemplars"]
#: The index a tenant key's lookup is answered from (migration 0004).
_TENANT_ID_INDEX = "ix_dpicl_contexts_tenant_id"


def _lookup(backend: str, *, exemplars: bool, tenant: bool) -> Select[Any] | TextualSelect:
    """One context by id (``:cid``), with or without its exemplars, and when ``tenant`` only
    if it is the tenant's (``:tenant``).

    Why the tenant is in the query and not checked afterwards: a key must not tell another
    tenant's context from a missing id, in its answer or in its time (issue 39). Loading the
    row first made a 404 for another tenant's 3 MB context 5 times slower than one for a
    missing id. Filtered here, PostgreSQL finds the row by its primary key and drops it on
    ``tenant`` without ever reading its exemplars (stored out of line, TOAST). SQLite keeps a
    row's columns in one record whose tail lies on overflow pages, and ``tenant`` comes after
    the exemplars: reading it walks every page of them (1 ms for 3 MB). So SQLite is told to
    answer from the (tenant, id) index, where another tenant's id is not found at all; its
    planner would otherwise pick the primary key's index and read the row.
    """
    cols = _INFO_COLUMNS if not exemplars else list(_ROWS.c)
    stmt = select(*cols).where(_ROWS.c.id == bindparam("cid"))
    if not tenant:
        return stmt
    stmt = stmt.where(_ROWS.c.tenant == bindparam("tenant"))
    if backend != "sqlite":
        return stmt
    # SQLAlchemy renders no index hint for SQLite: the statement as text, with one added.
    sql = str(stmt.compile(dialect=sqlite.dialect(paramstyle="named")))
    table = f"FROM {_ROWS.name}"
    if sql.count(table) != 1:  # pragma: no cover - the statement is built just above
        raise AssertionError(sql)
    sql = sql.replace(table, f"{table} INDEXED BY {_TENANT_ID_INDEX}")
    return text(sql).columns(*cols)


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
        group_commit_s: float = 0.0,
        rate_clock: Callable[[], float] | None = None,
    ) -> None:
        """``rate_clock``: the rate limit's clock (seconds since the epoch) in place of the
        database's (tests)."""
        self.db = Database(
            url,
            timeout_s=timeout_s,
            threads=threads,
            serialize_sqlite_writes=serialize_sqlite_writes,
        )
        self.url = url
        self.engine = self.db.engine
        self._rtol = rtol
        self.cache = ContextCache(cache_bytes)
        self._charges = ChargeStatements(self.db.backend, clock=rate_clock)
        backend = self.db.backend
        self._lookups = {
            (ex, tn): _lookup(backend, exemplars=ex, tenant=tn)
            for ex in (False, True)
            for tn in (False, True)
        }
        self.group_commit = GroupCommit(self._write_charges, self._charges, window_s=group_commit_s)

    def _write_charges(self, fn: Callable[[Connection], T]) -> Awaitable[T]:
        return self.db.run_core(fn, write=True, op="charge")

    def migrate(self) -> None:
        """Bring the schema to the newest revision (safe with many processes at once)."""
        self.db.migrate()

    def create_schema(self) -> None:
        """Alias of :meth:`migrate` (the schema is owned by the Alembic migrations)."""
        self.migrate()

    async def ping(self) -> None:
        """Raise :class:`StorageUnavailable` unless the database answers (readiness)."""
        await self.db.ping()

    async def schema_revision(self) -> str | None:
        """The Alembic revision the database is at (None: no schema), within the deadline."""
        return await self.db.schema_revision()

    async def run(self, fn: Callable[[Connection], T], *, write: bool = False) -> T:
        """Run ``fn`` in one transaction on this repository's pools (the key store's
        statements, :mod:`dpicl.store.keys`), with every guard of the repository's own."""
        return await self.db.run_core(fn, write=write, op="keys")

    async def add(self, row: ContextRow) -> StoredContext:
        def fn(s: Session) -> StoredContext:
            s.add(row)
            s.flush()
            return StoredContext.from_row(row)

        return await self.db.run_session(fn, write=True, op="add")

    async def get(self, context_id: str, *, tenant: str | None = None) -> StoredContext | None:
        """The context as stored now (fresh ledger columns); refreshes the cache.
        ``tenant``: only if it is that tenant's (a tenant key's lookup, see :func:`_lookup`);
        another tenant's context is then None, as a missing one."""
        row = await self._fetch(context_id, tenant, exemplars=True)
        if row is None:
            if tenant is None:
                self.cache.evict(context_id)
            return None
        ctx = StoredContext.from_row(row)
        self.cache.put(ctx)
        return ctx

    async def get_info(self, context_id: str, *, tenant: str | None = None) -> StoredContext | None:
        """The context's metadata and fresh ledger columns, without its exemplars (an empty
        tuple: never charge or query through it), filtered by ``tenant`` as :meth:`get`."""
        row = await self._fetch(context_id, tenant, exemplars=False)
        return StoredContext.from_row(row, exemplars=()) if row is not None else None

    async def _fetch(self, context_id: str, tenant: str | None, *, exemplars: bool) -> Any:
        stmt = self._lookups[(exemplars, tenant is not None)]
        params = {"cid": context_id} if tenant is None else {"cid": context_id, "tenant": tenant}

        def fn(conn: Connection) -> Any:
            return conn.execute(stmt, params).first()

        return await self.db.run_core(fn, op="get")

    async def get_for_query(
        self, context_id: str, *, tenant: str | None = None
    ) -> StoredContext | None:
        """The context a query is about to be charged to: from the cache when it is there.

        Its ledger columns may be stale; only the charge's result may be shown. A context
        deleted meanwhile is refused by the charge itself (no row to update). ``tenant``: as
        :meth:`get`; a cached context of another tenant is looked up like a missing one, so
        that it answers in the same time (issue 39).
        """
        ctx = self.cache.get(context_id)
        if ctx is not None and (tenant is None or ctx.tenant == tenant):
            return ctx
        return await self.get(context_id, tenant=tenant)

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

        listed = await self.db.run_core(fn, write=False, op="list")
        if len(listed) <= limit:
            return listed, None
        last = listed[limit - 1].context
        return listed[:limit], (last.created_at, last.id)

    async def delete(self, context_id: str) -> bool:
        def fn(s: Session) -> bool:
            res = s.execute(delete(ContextRow).where(ContextRow.id == context_id))
            return bool(getattr(res, "rowcount", 0))

        self.cache.evict(context_id)
        return await self.db.run_session(fn, write=True, op="delete")

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
        row (:mod:`dpicl.store.charges`), grouped with the concurrent charges of this
        process (:mod:`dpicl.store.group_commit`); a refusal changes nothing."""
        return await self.group_commit.charge(req)

    async def refund_charge(self, req: ChargeRequest, spend_id: int) -> None:
        """Undo a charge whose answer was never released (the engine failed)."""
        await self.db.run_core(
            lambda conn: refund_tx(conn, self._charges, req, spend_id), write=True, op="refund"
        )

    async def record_refusal(self, req: ChargeRequest) -> None:
        """A spend row saying ``req`` was refused (nothing was charged)."""
        await self.db.run_core(
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
        self.db.dispose()
