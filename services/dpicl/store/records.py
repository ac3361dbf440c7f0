"""The contexts as the store gives them out: immutable snapshots of a row
(:class:`StoredContext`), a listing's row without its exemplars (:class:`ListedContext`), the
key a page of contexts ends at, and context ids.

Below the repository and the context cache, which both hand these out; it imports no other
store module but the row model.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, JsonValue

from dpicl.store.models import ContextRow

R = TypeVar("R", bound=BaseModel)

__all__ = [
    "ContextKey",
    "ListedContext",
    "StoredContext",
    "is_context_id",
    "new_context_id",
]


@dataclass(frozen=True)
class StoredContext:
    """A context as read from the store (a detached, immutable snapshot)."""

    id: str
    name: str | None
    task: str
    labels: tuple[str, ...]
    exemplars: tuple[tuple[str, str], ...]
    template: str
    #: The mechanism record as stored: a JSON object, read through :meth:`record_as`.
    mechanism: dict[str, JsonValue]
    budget: dict[str, float] | None
    mu2_spent: float
    mu2_max: float | None
    queries: int
    max_queries: int | None
    created_at: datetime
    tenant: str | None = None
    #: The mechanism record parsed into typed models (:meth:`record_as`), each parsed once
    #: per loaded context. ``dataclasses.replace`` (the context after a charge) passes the
    #: same dict on: the record never changes, so neither do its parses.
    parsed: dict[type[BaseModel], BaseModel] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def mechanism_name(self) -> str:
        """The name of the mechanism that answers for the context (its record's ``name``)."""
        return str(self.mechanism.get("name"))

    def record_as(self, model: type[R]) -> R:
        """The mechanism record as ``model`` (the mechanism's typed calibration, or a part
        of it that a kit reads, such as the partition layout), parsed once: a record
        already parsed into a subclass of ``model`` is that parse."""
        hit = self.parsed.get(model)
        if hit is None:
            hit = next((v for v in self.parsed.values() if isinstance(v, model)), None)
            if hit is None:
                hit = model.model_validate(self.mechanism)
            self.parsed[model] = hit
        assert isinstance(hit, model)
        return hit

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


def new_context_id() -> str:
    return "ctx_" + secrets.token_hex(12)


_CONTEXT_ID = re.compile(r"ctx_[0-9a-f]{24}")


def is_context_id(value: str) -> bool:
    """Whether ``value`` can name a context; anything else is looked up nowhere."""
    return _CONTEXT_ID.fullmatch(value) is not None
