"""Tables. SQLite by default, PostgreSQL by ``DPICL_DATABASE_URL``.

The ledger lives in the context row itself so that a charge is one conditional UPDATE of
one row: atomic on both back ends, whatever the number of server processes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Index, Integer, String, Text
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

    # GET /v1/contexts pages in this order with a keyset cursor: the index makes each page
    # a range scan of `limit` rows, not a sort of the whole table.
    __table_args__ = (Index("ix_dpicl_contexts_created_at_id", "created_at", "id"),)
