"""API keys as database records, and who a request acts for (:class:`Principal`).

A key's secret is ``dpk_`` + 32 random bytes (``secrets.token_urlsafe``): 256 bits of entropy.
Only its SHA-256 is stored. A slow password hash (bcrypt, scrypt, Argon2) exists to make
guessing *low-entropy* secrets expensive after a database leak; nobody can enumerate 2^256
secrets however fast the hash, so a slow hash would only add tens of milliseconds to every
request (each request is authenticated against the database, see below) and buy nothing.
An unkeyed hash also needs no server-side pepper that every replica would have to share.

Lookup is by the hash (an indexed equality), then the stored hash is compared to the
computed one with :func:`secrets.compare_digest`. What a timing difference could reveal is
at most how a guess's *hash* relates to stored hashes, which says nothing about a secret.

Every request looks its key up in the database, with no per-process cache: a revoked key
is refused by every process from the moment ``DELETE /v1/keys/{id}`` commits. The charge's
transaction checks revocation again (:mod:`dpicl.store.charges`), so a key revoked while its
request was in flight cannot be charged either.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import Connection, Table, case, delete, func, insert, select, update

from dpicl.store.models import KeyRow, RateEventRow, SpendRow

KEY_PREFIX = "dpk_"
_KEYS = cast(Table, KeyRow.__table__)
_RATE = cast(Table, RateEventRow.__table__)
_SPEND = cast(Table, SpendRow.__table__)

PrincipalKind = Literal["admin", "static", "key", "internal"]


def new_secret() -> str:
    """A fresh key secret (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(12)


#: The form of every id :func:`new_key_id` makes.
KEY_ID_PATTERN = r"^key_[0-9a-f]{24}$"
_KEY_ID = re.compile(KEY_ID_PATTERN)


def is_key_id(value: str) -> bool:
    """Whether ``value`` has the form of a key id (anything else is never looked up)."""
    return _KEY_ID.fullmatch(value) is not None


def secret_hash(secret: str) -> str:
    """The stored form of a secret: its SHA-256, hex (see the module docstring for why)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def static_key_id(secret: str) -> str:
    """The stable, non-secret id of a static key (``DPICL_API_KEYS``): 32 bits of its scrypt
    hash, enough to tell an operator's few static keys apart in the spend record and the
    logs. Static keys are typed by operators and may be weak: scrypt (computed once per key,
    at start) makes confirming a guessed key against a logged id as slow as scrypt, where
    32 bits of a plain SHA-256 would confirm millions of guesses a second."""
    digest = hashlib.scrypt(
        secret.encode("utf-8", "surrogatepass"),
        salt=b"dpicl static key id",
        n=2**14,
        r=8,
        p=1,
        dklen=16,
    )
    return "static-" + digest.hex()[:8]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: the admin, a static key, a database key, or the server itself
    (``internal``: library use, no request). Only a database key is scoped and limited."""

    key_id: str
    kind: PrincipalKind
    tenant: str | None = None
    contexts: frozenset[str] | None = None
    budgeted: bool = False

    @property
    def stored(self) -> bool:
        """Whether the key is a database record (its row is charged with every answer)."""
        return self.kind == "key"

    def reaches(self, context_id: str, tenant: str | None) -> bool:
        """Whether this principal may see and query the context ``context_id`` of
        ``tenant``. The admin and static keys reach every context (the single-tenant
        case); a database key only its listed contexts or its tenant's."""
        if self.kind != "key":
            return True
        if self.contexts is not None:
            return context_id in self.contexts
        return self.tenant is not None and tenant == self.tenant

    def may_reach(self, context_id: str) -> bool:
        """Whether any context named ``context_id`` could be in this principal's scope,
        known without a lookup: False for an id outside a key's list (or for a key with
        neither a list nor a tenant). Such an id is refused before the database is asked, in
        the same time whether or not it exists."""
        if self.kind != "key":
            return True
        if self.contexts is not None:
            return context_id in self.contexts
        return self.tenant is not None

    @property
    def lookup_tenant(self) -> str | None:
        """The tenant a context lookup filters by (a tenant key's), or None (no filter)."""
        return self.tenant if self.kind == "key" and self.contexts is None else None


ADMIN = Principal(key_id="admin", kind="admin")
INTERNAL = Principal(key_id="internal", kind="internal")


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A key as stored, without its secret (nor its hash)."""

    id: str
    name: str | None
    tenant: str | None
    contexts: tuple[str, ...] | None
    budget: dict[str, float] | None
    mu2_spent: float
    mu2_max: float | None
    queries: int
    rate_limit: int | None
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> StoredKey:
        return cls(
            id=row.id,
            name=row.name,
            tenant=row.tenant,
            contexts=tuple(row.contexts) if row.contexts is not None else None,
            budget=dict(row.budget) if row.budget is not None else None,
            mu2_spent=float(row.mu2_spent),
            mu2_max=row.mu2_max,
            queries=int(row.queries),
            rate_limit=row.rate_limit,
            created_at=_utc(row.created_at),
            revoked_at=_utc(row.revoked_at) if row.revoked_at is not None else None,
        )

    def principal(self) -> Principal:
        return Principal(
            key_id=self.id,
            kind="key",
            tenant=self.tenant,
            contexts=frozenset(self.contexts) if self.contexts is not None else None,
            budgeted=self.mu2_max is not None,
        )


def _utc(at: datetime) -> datetime:
    # SQLite keeps no offset; every timestamp is written in UTC.
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


_COLUMNS = [c for c in _KEYS.c if c.name != "secret_hash"]


def insert_key(conn: Connection, values: dict[str, Any]) -> StoredKey:
    conn.execute(insert(_KEYS).values(**values))
    row = conn.execute(select(*_COLUMNS).where(_KEYS.c.id == values["id"])).one()
    return StoredKey.from_row(row)


def find_by_secret(conn: Connection, secret: str) -> StoredKey | None:
    """The live (unrevoked) key whose secret is ``secret``, or None."""
    digest = secret_hash(secret)
    stmt = select(*_COLUMNS, _KEYS.c.secret_hash).where(_KEYS.c.secret_hash == digest)
    row = conn.execute(stmt).first()
    if row is None or not secrets.compare_digest(row.secret_hash, digest):
        return None
    if row.revoked_at is not None:
        return None
    return StoredKey.from_row(row)


def list_keys(
    conn: Connection, *, include_revoked: bool, limit: int, after: str | None
) -> tuple[list[StoredKey], str | None]:
    """Up to ``limit`` keys in id order after the id ``after``, and the last one's id when
    more follow (keyset pagination on the primary key)."""
    stmt = select(*_COLUMNS).order_by(_KEYS.c.id).limit(limit + 1)
    if not include_revoked:
        stmt = stmt.where(_KEYS.c.revoked_at.is_(None))
    if after is not None:
        stmt = stmt.where(_KEYS.c.id > after)
    keys = [StoredKey.from_row(r) for r in conn.execute(stmt)]
    if len(keys) <= limit:
        return keys, None
    return keys[:limit], keys[limit - 1].id


def revoke_key(conn: Connection, key_id: str) -> bool:
    """Revoke ``key_id`` and delete its rate-limit log; False when there is no such live key.

    The log's entries of a key are otherwise deleted only by that key's next charge
    (:mod:`dpicl.store.charges`), which a revoked key never has: each revoked key left up
    to ``rate_limit`` rows behind for ever (found by the soak, issue 47). A charge of this
    key already past its UPDATE holds the key's row lock, so this waits for it (PostgreSQL)
    or runs before or after it (SQLite's one writer); either way nothing is logged after."""
    res = conn.execute(
        update(_KEYS)
        .where(_KEYS.c.id == key_id, _KEYS.c.revoked_at.is_(None))
        .values(revoked_at=datetime.now(UTC))
    )
    revoked = bool(getattr(res, "rowcount", 0))
    if revoked:
        conn.execute(delete(_RATE).where(_RATE.c.key_id == key_id))
    return revoked


@dataclass(frozen=True, slots=True)
class SpendTotal:
    key_id: str
    answered: int
    refused: int
    refunded: int
    mu2: float  # of the answered charges


@dataclass(frozen=True, slots=True)
class SpendEntry:
    id: int
    at: datetime
    key_id: str
    context_id: str
    epsilon: float
    delta: float
    mu2: float
    outcome: str


def spend_of(
    conn: Connection, context_id: str, recent: int
) -> tuple[list[SpendTotal], list[SpendEntry]]:
    """Totals by key and the ``recent`` newest rows of one context's spend record."""
    s = _SPEND.c
    answered = s.outcome == "answered"
    totals = conn.execute(
        select(
            s.key_id,
            func.sum(case((answered, 1), else_=0)).label("answered"),
            func.sum(case((s.outcome == "refused", 1), else_=0)).label("refused"),
            func.sum(case((s.outcome == "refunded", 1), else_=0)).label("refunded"),
            func.sum(case((answered, s.mu2), else_=0.0)).label("mu2"),
        )
        .where(s.context_id == context_id)
        .group_by(s.key_id)
        .order_by(s.key_id)
    )
    out = [
        SpendTotal(
            key_id=r.key_id,
            answered=int(r.answered or 0),
            refused=int(r.refused or 0),
            refunded=int(r.refunded or 0),
            mu2=float(r.mu2 or 0.0),
        )
        for r in totals
    ]
    rows = conn.execute(
        select(_SPEND).where(s.context_id == context_id).order_by(s.id.desc()).limit(recent)
    )
    entries = [
        SpendEntry(
            id=int(r.id),
            at=_utc(r.at),
            key_id=r.key_id,
            context_id=r.context_id,
            epsilon=float(r.epsilon),
            delta=float(r.delta),
            mu2=float(r.mu2),
            outcome=r.outcome,
        )
        for r in rows
    ]
    return out, entries
