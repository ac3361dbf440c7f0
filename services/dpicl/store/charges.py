"""A charge's SQL: the key's limits, the context's ledger and the spend row, in one transaction.

A query is admitted only if, in ONE transaction,

1. the key's row (a database key) takes it: not revoked, its own budget
   (``mu2_spent + mu2 <= mu2_max * slack``); one conditional UPDATE, which also locks the row;
   then, for a key with a rate limit, its window: fewer than ``rate_limit`` answers in the
   last 60 s of its log (:data:`RATE_WINDOW_US`), and this answer's entry in it;
2. the context's row takes it: the context's conditional UPDATE (:data:`CHARGE`);
3. a spend row records it (``answered``).

Any refusal rolls the whole transaction back, so neither budget is touched (in a group of
concurrent charges, :func:`charge_group`, it rolls back only that member's writes). Each UPDATE is
atomic on both back ends (SQLite: one writer at a time; PostgreSQL: a row lock, the WHERE
clause re-evaluated on the locked row), and a transaction locks the key's row before the
context's, always in that order (a refund too), so two charges cannot deadlock. So no
number of server processes on one database can overspend either budget or exceed the rate
limit.

The rate limit is a sliding window (issue 47; it was a fixed window on the clock minute, which
let up to twice the limit through around a minute's end): at most ``rate_limit`` answers in
ANY 60 s, a burst of all of them included. Each admitted answer of a rate-limited key logs
its time (``dpicl_rate_events``), read from the *database's* clock, so servers whose clocks
differ share one window. The window is counted after the key's UPDATE has locked the key's
row, in a statement of its own: on PostgreSQL (read committed) that statement sees every
entry committed by the transactions that held the lock before, so two processes cannot both
take the last place; SQLite has one writer. A refusal's ``Retry-After`` is when the oldest
entry leaves the window (an answer is admitted then, unless another client of the key
takes the place first). Refused requests are not logged; a refunded answer keeps its entry
(it held a place in the window while it ran).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    Table,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.engine.interfaces import Compiled
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import BindParameter, ColumnElement

from dpicl.store.keys import Principal
from dpicl.store.models import ContextRow, KeyRow, RateEventRow, SpendRow

_CTX = cast(Table, ContextRow.__table__)
_KEYS = cast(Table, KeyRow.__table__)
_SPEND = cast(Table, SpendRow.__table__)
_RATE = cast(Table, RateEventRow.__table__)
_MU2 = bindparam("mu2", type_=Float)

#: The charge, built once: bound parameters only, so every request reuses one compiled
#: statement. Both conditions and the increment are one UPDATE of one row (atomic; see the
#: module docstring); ``slack`` is 1 + the relative tolerance of the budget's mu^2.
CHARGE = (
    update(_CTX)
    .where(
        _CTX.c.id == bindparam("cid"),
        _CTX.c.mu2_max.is_(None)
        | (_CTX.c.mu2_spent + _MU2 <= _CTX.c.mu2_max * bindparam("slack", type_=Float)),
        _CTX.c.max_queries.is_(None) | (_CTX.c.queries < _CTX.c.max_queries),
    )
    .values(mu2_spent=_CTX.c.mu2_spent + _MU2, queries=_CTX.c.queries + 1)
    .returning(_CTX.c.mu2_spent, _CTX.c.queries)
)

#: Undo a charge whose answer was never released, never below zero.
REFUND = (
    update(_CTX)
    .where(_CTX.c.id == bindparam("cid"))
    .values(
        mu2_spent=case((_CTX.c.mu2_spent > _MU2, _CTX.c.mu2_spent - _MU2), else_=0.0),
        queries=case((_CTX.c.queries > 0, _CTX.c.queries - 1), else_=0),
    )
)

RefusalReason = Literal["context", "key_budget", "rate", "revoked"]


@dataclass(frozen=True, slots=True)
class Charged:
    """The ledger after an admitted charge, and its spend row."""

    mu2_spent: float
    queries: int
    spend_id: int


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing was charged. ``retry_after_s``: for ``rate``, the seconds until the key's
    oldest answer in the window leaves it."""

    reason: RefusalReason
    retry_after_s: int = 0


class Rollback(Exception):
    """Control flow: the repository rolls the charge's transaction back."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.reason)
        self.refused = refused


#: The rate limit's window: ``rate_limit`` answers in any this many microseconds.
RATE_WINDOW_US = 60_000_000


def _now_us(backend: str) -> ColumnElement[Any]:
    """The database's clock in microseconds since the epoch: fixed within a statement
    (PostgreSQL's statement_timestamp(); SQLite's 'now', to the millisecond) and shared by
    every server process."""
    if backend == "postgresql":
        return literal_column(
            "CAST(floor(extract(epoch from statement_timestamp()) * 1000000) AS BIGINT)",
            BigInteger,
        )
    return literal_column(
        "CAST(round((julianday('now') - 2440587.5) * 86400000000.0) AS INTEGER)", BigInteger
    )


class ChargeStatements:
    """The statements of a charge and a refund for one back end, built once."""

    def __init__(
        self,
        backend: str,
        context_charge: Any = CHARGE,
        context_refund: Any = REFUND,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock``: seconds since the epoch for the rate window, in place of the
        database's clock (tests set the instant of each charge)."""
        k = _KEYS.c
        self.context_charge = context_charge
        self.context_refund = context_refund
        self.key_charge = (
            update(_KEYS)
            .where(
                k.id == bindparam("kid"),
                k.revoked_at.is_(None),
                k.mu2_max.is_(None)
                | (k.mu2_spent + _MU2 <= k.mu2_max * bindparam("slack", type_=Float)),
            )
            # Every right-hand side reads the row as it was before this UPDATE.
            .values(mu2_spent=k.mu2_spent + _MU2, queries=k.queries + 1)
            .returning(k.id, k.rate_limit)
        )
        self.key_state = select(k.revoked_at).where(k.id == bindparam("kid"))
        # The clock is read once per charge, by the window's count, and bound after that:
        # the entry logged is the instant that was counted.
        self.clock = clock
        now = bindparam("now_us", type_=BigInteger) if clock is not None else _now_us(backend)
        e = _RATE.c
        in_window = (e.key_id == bindparam("kid")) & (e.at_us > now - RATE_WINDOW_US)
        self.rate_window = select(
            now.label("now_us"),
            select(func.count()).where(in_window).scalar_subquery().label("n"),
            select(func.min(e.at_us)).where(in_window).scalar_subquery().label("oldest"),
        )
        self.rate_log = insert(_RATE).values(
            key_id=bindparam("kid"), at_us=bindparam("at_us", type_=BigInteger)
        )
        self.rate_prune = delete(_RATE).where(
            e.key_id == bindparam("kid"),
            e.at_us <= bindparam("at_us", type_=BigInteger) - RATE_WINDOW_US,
        )
        self.key_refund = (
            update(_KEYS)
            .where(k.id == bindparam("kid"))
            .values(
                mu2_spent=case((k.mu2_spent > _MU2, k.mu2_spent - _MU2), else_=0.0),
                queries=case((k.queries > 0, k.queries - 1), else_=0),
            )
        )
        self.spend = insert(_SPEND).returning(_SPEND.c.id)
        # A group's spend rows in one INSERT, their ids in the order of the parameters.
        self.spend_many = insert(_SPEND).returning(_SPEND.c.id, sort_by_parameter_order=True)
        # A group's rows locked up front, keys before contexts, each in id order: the lock
        # order every transaction follows (see charge_group). SQLite locks the database.
        self.backend = backend
        ids: BindParameter[Any] = bindparam("ids", expanding=True)
        self.lock_keys = (
            select(k.id).where(k.id.in_(ids)).order_by(k.id).with_for_update(key_share=True)
        )
        self.lock_contexts = (
            select(_CTX.c.id)
            .where(_CTX.c.id.in_(ids))
            .order_by(_CTX.c.id)
            .with_for_update(key_share=True)
        )
        self.spend_refunded = (
            update(_SPEND)
            .where(_SPEND.c.id == bindparam("sid"), _SPEND.c.outcome == "answered")
            .values(outcome="refunded")
        )
        self._compiled_charge: Compiled | None = None

    def compiled_context_charge(self, conn: Connection) -> Compiled:
        """The context's charge compiled for ``conn``'s dialect (once)."""
        if self._compiled_charge is None:
            self._compiled_charge = self.context_charge.compile(dialect=conn.dialect)
        return self._compiled_charge


def _why_key_refused(conn: Connection, st: ChargeStatements, kid: str) -> Refused:
    row = conn.execute(st.key_state, {"kid": kid}).first()
    if row is None or row.revoked_at is not None:
        return Refused("revoked")
    return Refused("key_budget")


def _take_rate_place(conn: Connection, st: ChargeStatements, kid: str, limit: int) -> None:
    """Log this answer in the key's window, or :class:`Rollback` when the last 60 s hold
    ``limit`` answers already. Runs after the key's UPDATE locked its row (module
    docstring: why that makes it atomic across processes)."""
    params: dict[str, Any] = {"kid": kid}
    if st.clock is not None:
        params["now_us"] = round(st.clock() * 1e6)
    row = conn.execute(st.rate_window, params).one()
    now_us = int(row.now_us)
    if int(row.n) >= limit:
        # Free when the oldest entry leaves the window: at oldest + window exactly.
        wait_us = int(row.oldest) + RATE_WINDOW_US - now_us
        raise Rollback(Refused("rate", retry_after_s=max(1, -(-wait_us // 1_000_000))))
    conn.execute(st.rate_prune, {"kid": kid, "at_us": now_us})
    conn.execute(st.rate_log, {"kid": kid, "at_us": now_us})


@dataclass(frozen=True, slots=True)
class ChargeRequest:
    context_id: str
    principal: Principal
    mu2: float
    epsilon: float
    delta: float
    slack: float


def _admit(conn: Connection, st: ChargeStatements, req: ChargeRequest) -> Any:
    """The key's and the context's conditional UPDATEs; the context's row after them, or
    :class:`Rollback` (the key's UPDATE may then have been made: the caller rolls back)."""
    p = req.principal
    if p.stored:
        params = {"kid": p.key_id, "mu2": req.mu2, "slack": req.slack}
        key = conn.execute(st.key_charge, params).first()
        if key is None:
            raise Rollback(_why_key_refused(conn, st, p.key_id))
        if key.rate_limit is not None:
            _take_rate_place(conn, st, p.key_id, int(key.rate_limit))
    row = conn.execute(
        st.context_charge, {"cid": req.context_id, "mu2": req.mu2, "slack": req.slack}
    ).first()
    if row is None:
        raise Rollback(Refused("context"))
    return row


def charge(conn: Connection, st: ChargeStatements, req: ChargeRequest) -> Charged:
    """Run the charge in ``conn``'s transaction; raise :class:`Rollback` (the caller rolls
    back and reports its :class:`Refused`) when anything refuses it."""
    row = _admit(conn, st, req)
    spend_id = conn.execute(st.spend, [_spend_values(req, "answered")]).scalar_one()
    return Charged(mu2_spent=float(row[0]), queries=int(row[1]), spend_id=int(spend_id))


def charge_group(
    conn: Connection, st: ChargeStatements, reqs: Sequence[ChargeRequest]
) -> list[Charged | Refused]:
    """Run several charges in ``conn``'s one transaction, in order, each admitted as by
    :func:`charge`: each member sees the rows as the members before it left them.

    A refused member changes nothing: without a key row its only write is the context's
    conditional UPDATE, which a refusal does not apply; with one (two conditional UPDATEs:
    the key's may be applied before the context's refuses) it runs inside a SAVEPOINT,
    rolled back on refusal. The answered members' spend rows are then written in one
    multi-row INSERT (their ids returned in the members' order). Any other error leaves the
    transaction to fail whole (every member gets it; nothing is charged).

    Locks: on PostgreSQL, when the group touches more than one row, the members' key rows,
    then their context rows, each in id order, are locked first (``FOR NO KEY UPDATE``, the
    lock an UPDATE takes), so two groups, or a group and a single charge or refund (key
    row, then context row), never wait for each other in a cycle. On SQLite the
    transaction takes the database's write lock at once (``BEGIN IMMEDIATE``; it also keeps
    the driver from starting the transaction at a first savepoint, whose RELEASE would then
    commit it).

    On PostgreSQL a group without key rows sends its members' UPDATEs in one pipeline
    (:func:`_context_charges_pipelined`) after locking their context rows: the same
    statements in the same order in the same transaction, one round trip instead of one per
    member.
    """
    # PostgreSQL, no key rows: each member is one conditional UPDATE of its context's row.
    pipelined = st.backend == "postgresql" and not any(r.principal.stored for r in reqs)
    _lock_group(conn, st, reqs, pipelined=pipelined)
    admitted = _admit_pipelined(conn, st, reqs) if pipelined else _admit_each(conn, st, reqs)
    return _record_answered(conn, st, reqs, admitted)


def _lock_group(
    conn: Connection, st: ChargeStatements, reqs: Sequence[ChargeRequest], *, pipelined: bool
) -> None:
    """Take the group's locks before its first write (see :func:`charge_group`)."""
    if st.backend == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
        return
    keys = sorted({r.principal.key_id for r in reqs if r.principal.stored})
    contexts = sorted({r.context_id for r in reqs})
    # Pipelined, the lock also goes first when there is one row: a statement that
    # SQLAlchemy runs, so a stale pooled connection is found, and retried, as before.
    if len(keys) + len(contexts) > 1 or pipelined:
        if keys:
            conn.execute(st.lock_keys, {"ids": keys}).all()
        conn.execute(st.lock_contexts, {"ids": contexts}).all()


#: An admitted member's context row after its charge: (``mu2_spent``, ``queries``).
Admitted = Sequence[Any]


def _admit_each(
    conn: Connection, st: ChargeStatements, reqs: Sequence[ChargeRequest]
) -> list[Admitted | Refused]:
    """Each member admitted in turn; one with a key row in a SAVEPOINT, rolled back when it
    is refused (its key's UPDATE may have been applied before its context's refused)."""
    out: list[Admitted | Refused] = []
    for req in reqs:
        savepoint = conn.begin_nested() if req.principal.stored else None
        try:
            row = _admit(conn, st, req)
        except Rollback as exc:
            if savepoint is not None:
                savepoint.rollback()
            out.append(exc.refused)
            continue
        if savepoint is not None:
            savepoint.commit()
        out.append(row)
    return out


def _admit_pipelined(
    conn: Connection, st: ChargeStatements, reqs: Sequence[ChargeRequest]
) -> list[Admitted | Refused]:
    """Members without key rows: their context UPDATEs in one pipeline (one round trip, not
    one per member), still in order in this transaction."""
    rows = _context_charges_pipelined(conn, st, reqs)
    return [Refused("context") if row is None else row for row in rows]


def _record_answered(
    conn: Connection,
    st: ChargeStatements,
    reqs: Sequence[ChargeRequest],
    admitted: Sequence[Admitted | Refused],
) -> list[Charged | Refused]:
    """The admitted members' spend rows in one multi-row INSERT (ids in their order), and
    every member's result."""
    answered = [req for req, a in zip(reqs, admitted, strict=True) if not isinstance(a, Refused)]
    ids: Sequence[Any] = ()
    if answered:
        values = [_spend_values(req, "answered") for req in answered]
        ids = conn.execute(st.spend_many, values).scalars().all()
    if len(ids) != len(answered):  # one id per row, whatever the driver
        raise RuntimeError(f"{len(ids)} spend ids for {len(answered)} answered charges")
    spend_ids = iter(ids)
    return [
        a
        if isinstance(a, Refused)
        else Charged(mu2_spent=float(a[0]), queries=int(a[1]), spend_id=int(next(spend_ids)))
        for a in admitted
    ]


def _context_charges_pipelined(
    conn: Connection, st: ChargeStatements, reqs: Sequence[ChargeRequest]
) -> list[Any]:
    """The context's conditional UPDATE of each member (no key rows), in order, in ``conn``'s
    transaction, sent to PostgreSQL in one pipeline (psycopg's ``executemany``): the row each
    returned (``mu2_spent``, ``queries``), or None where it refused.

    The very statement of :data:`CHARGE`, compiled for the connection's dialect, once per
    member and in the members' order: PostgreSQL runs a pipeline's statements one after
    another in the transaction, so each sees the row as the members before it left it, as
    one ``execute`` per member did. It saves the round trip per member that a group spent
    waiting, on its storage thread, for the network and then for the GIL (issue 30). An
    error is raised as SQLAlchemy's (the guards map it to ``StorageUnavailable``; bound
    parameters hidden) and fails the whole transaction, as any error in a group does."""
    compiled = st.compiled_context_charge(conn)
    sql = compiled.string
    params = [
        compiled.construct_params({"cid": r.context_id, "mu2": r.mu2, "slack": r.slack})
        for r in reqs
    ]
    dbapi_conn = conn.connection.dbapi_connection
    assert dbapi_conn is not None
    rows: list[Any] = []
    # psycopg's cursor (the protocol SQLAlchemy types it with has no ``returning``).
    cur: Any = dbapi_conn.cursor()
    try:
        cur.executemany(sql, params, returning=True)
        while True:
            rows.append(cur.fetchone())
            if not cur.nextset():
                break
    except conn.dialect.loaded_dbapi.Error as exc:
        raise DBAPIError.instance(
            sql, None, exc, conn.dialect.loaded_dbapi.Error, hide_parameters=True
        ) from None
    finally:
        cur.close()
    if len(rows) != len(reqs):  # a result per statement, whatever the driver
        raise DBAPIError.instance(
            sql,
            None,
            RuntimeError(f"{len(rows)} results for {len(reqs)} charges"),
            Exception,
            hide_parameters=True,
        )
    return rows


def refund(conn: Connection, st: ChargeStatements, req: ChargeRequest, spend_id: int) -> None:
    """Undo an answered charge (the engine failed): both ledgers and its spend row."""
    # The key's row first, as in a charge: two transactions never lock the two rows in
    # opposite orders (a deadlock on PostgreSQL).
    if req.principal.stored:
        conn.execute(st.key_refund, {"kid": req.principal.key_id, "mu2": req.mu2})
    conn.execute(st.context_refund, {"cid": req.context_id, "mu2": req.mu2})
    conn.execute(st.spend_refunded, {"sid": spend_id})


def record_refusal(conn: Connection, st: ChargeStatements, req: ChargeRequest) -> None:
    conn.execute(insert(_SPEND).values(**_spend_values(req, "refused")))


def _spend_values(req: ChargeRequest, outcome: str) -> dict[str, Any]:
    return {
        "at": datetime.now(UTC),
        "key_id": req.principal.key_id,
        "context_id": req.context_id,
        "epsilon": req.epsilon,
        "delta": req.delta,
        "mu2": req.mu2,
        "outcome": outcome,
    }


__all__ = [
    "CHARGE",
    "REFUND",
    "ChargeRequest",
    "ChargeStatements",
    "Charged",
    "Refused",
    "Rollback",
    "charge",
    "charge_group",
    "record_refusal",
    "refund",
]
