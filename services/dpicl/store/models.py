"""Tables. SQLite by default, PostgreSQL by ``DPICL_DATABASE_URL``.

The ledger lives in the context row itself so that a charge is one conditional UPDATE of
one row: atomic on both back ends, whatever the number of server processes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


def _now() -> datetime:
    return datetime.now(UTC)


class ContextRow(Base):
    __tablename__ = "dpicl_contexts"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    task: Mapped[str] = mapped_column(String(20))
    labels: Mapped[list[str]] = mapped_column(JSON)
    exemplars: Mapped[list[dict[str, str]]] = mapped_column(JSON)
    template: Mapped[str] = mapped_column(Text)
    mechanism: Mapped[dict[str, Any]] = mapped_column(JSON)
    budget: Mapped[dict[str, float] | None] = mapped_column(JSON)
    # Ledger state. mu2_max is +inf-free: NULL means "no budget".
    mu2_spent: Mapped[float] = mapped_column(Float, default=0.0)
    mu2_max: Mapped[float | None] = mapped_column(Float)
    queries: Mapped[int] = mapped_column(Integer, default=0)
    max_queries: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    # The tenant whose keys reach this context (set by the admin at creation); NULL: none.
    tenant: Mapped[str | None] = mapped_column(String(64))

    # GET /v1/contexts pages in this order with a keyset cursor: the index makes each page
    # a range scan of `limit` rows, not a sort of the whole table.
    __table_args__ = (
        Index("ix_dpicl_contexts_created_at_id", "created_at", "id"),
        Index("ix_dpicl_contexts_tenant_created_at_id", "tenant", "created_at", "id"),
        # A tenant key's lookup (id = ? AND tenant = ?) answered from the index alone: another
        # tenant's row is never read, so its size cannot show in a 404's time (issue 39).
        Index("ix_dpicl_contexts_tenant_id", "tenant", "id"),
    )


class KeyRow(Base):
    """An API key: only the SHA-256 of its secret is stored (see :mod:`dpicl.store.keys`).

    Its own ledger (``mu2_spent``, ``queries``) and rate window live in the row, so the
    key's charge is one conditional UPDATE, like the context's, in the same transaction.
    """

    __tablename__ = "dpicl_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # Scope: exactly one of a tenant or a list of context ids.
    tenant: Mapped[str | None] = mapped_column(String(64))
    contexts: Mapped[list[str] | None] = mapped_column(JSON)
    budget: Mapped[dict[str, float] | None] = mapped_column(JSON)
    mu2_spent: Mapped[float] = mapped_column(Float, default=0.0)
    mu2_max: Mapped[float | None] = mapped_column(Float)
    queries: Mapped[int] = mapped_column(Integer, default=0)
    # Answers in any 60 s (the log: RateEventRow). rate_window and rate_count held the fixed
    # clock-minute window before migration 0005; unused since (kept: dropping columns
    # would break servers of the previous version during a rolling upgrade).
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    rate_window: Mapped[int | None] = mapped_column(BigInteger)
    rate_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SpendRow(Base):
    """One charge, refusal or refund: who (key id), what (context), how much. Never the
    query text."""

    __tablename__ = "dpicl_spend"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    key_id: Mapped[str] = mapped_column(String(40))
    context_id: Mapped[str] = mapped_column(String(40))
    epsilon: Mapped[float] = mapped_column(Float)
    delta: Mapped[float] = mapped_column(Float)
    mu2: Mapped[float] = mapped_column(Float)
    # answered (charged; the answer was or may have been released), refused (nothing
    # charged), refunded (charged, then undone: the engine failed).
    outcome: Mapped[str] = mapped_column(String(16))

    __table_args__ = (
        Index("ix_dpicl_spend_context_id_id", "context_id", "id"),
        Index("ix_dpicl_spend_key_id", "key_id"),
    )


class RateEventRow(Base):
    """One answer admitted under a key's rate limit, at the database's clock (microseconds
    since the epoch): the sliding window's log. A key keeps at most ``rate_limit`` rows
    younger than the window; older ones are deleted by the charges that follow."""

    __tablename__ = "dpicl_rate_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(40))
    at_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_dpicl_rate_events_key_id_at_us", "key_id", "at_us"),)
