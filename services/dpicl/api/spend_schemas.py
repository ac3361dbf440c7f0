"""Response and request models of keys (``/v1/keys``) and of the spend record
(``GET /v1/contexts/{id}/spend``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from dpicl.domain import MAX_NAME_CHARS, BudgetSpec, JsonNumber, Tenant, Text
from dpicl.privacy.accounting import spent_epsilon
from dpicl.privacy.ledger import Cost, Ledger
from dpicl.store.keys import SpendEntry, SpendTotal, StoredKey
from dpicl.store.repository import StoredContext

#: Context ids one key may be scoped to.
MAX_KEY_CONTEXTS = 1000
#: Requests per minute a rate limit may allow.
MAX_RATE_LIMIT = 1_000_000


#: Exactly one scope, in the published schema (issue 39: it admitted a key with both, which
#: the route refuses): a tenant, or a list of contexts, not both and not neither.
_ONE_SCOPE: JsonDict = {
    "oneOf": [
        {"required": ["tenant"], "properties": {"tenant": {"type": "string"}}},
        {"required": ["contexts"], "properties": {"contexts": {"type": "array"}}},
    ]
}


class KeySpec(BaseModel):
    """The body of ``POST /v1/keys``: exactly one scope (a tenant or a list of contexts)."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_ONE_SCOPE)

    name: Annotated[Text, Field(max_length=MAX_NAME_CHARS)] | None = None
    tenant: Tenant | None = Field(
        default=None, description="The key reaches every context of this tenant."
    )
    contexts: (
        Annotated[
            list[Annotated[str, Field(pattern=r"^ctx_[0-9a-f]{24}$")]],
            Field(min_length=1, max_length=MAX_KEY_CONTEXTS),
        ]
        | None
    ) = Field(default=None, description="The key reaches exactly these contexts.")
    budget: BudgetSpec | None = Field(
        default=None,
        description="The key's own privacy budget over every context it queries, composed "
        "like a context's (mu^2 of the Gaussian mechanisms); null: none.",
    )
    rate_limit: Annotated[int, Field(ge=1, le=MAX_RATE_LIMIT), JsonNumber] | None = Field(
        default=None,
        description="At most this many answers in any 60 s (a sliding window); null: none.",
    )


class KeySpent(BaseModel):
    queries: int = Field(description="Answers charged to this key.")
    spent_epsilon: float | None = Field(
        description="Exact composed epsilon at the budget's delta; null without a budget."
    )
    remaining_epsilon: float | None


class KeyInfo(BaseModel):
    """A key without its secret."""

    id: str
    name: str | None
    tenant: str | None
    contexts: list[str] | None
    budget: dict[str, float] | None
    rate_limit: int | None
    spent: KeySpent
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, key: StoredKey) -> KeyInfo:
        spent: float | None = None
        remaining: float | None = None
        if key.budget is not None:
            spent = spent_epsilon(key.mu2_spent, key.budget["delta"])
            remaining = max(key.budget["epsilon"] - spent, 0.0)
        return cls(
            id=key.id,
            name=key.name,
            tenant=key.tenant,
            contexts=list(key.contexts) if key.contexts is not None else None,
            budget=key.budget,
            rate_limit=key.rate_limit,
            spent=KeySpent(queries=key.queries, spent_epsilon=spent, remaining_epsilon=remaining),
            created_at=key.created_at,
            revoked_at=key.revoked_at,
        )


class KeyCreated(KeyInfo):
    secret: str = Field(
        description="The key itself (Authorization: Bearer <secret>). Shown only in this "
        "response: the server keeps its SHA-256 alone."
    )


class KeyList(BaseModel):
    data: list[KeyInfo]
    next: str | None = Field(
        default=None, description="Pass as `after` for the next page; null on the last page."
    )


class SpendByKey(BaseModel):
    key_id: str = Field(description="key_..., static-<8 hex>, admin or internal.")
    answered: int
    refused: int
    refunded: int
    spent_epsilon: float = Field(
        description="The exact epsilon of this key's answered charges alone, at the "
        "context's delta (composed as the context's ledger composes)."
    )


class SpendRowInfo(BaseModel):
    id: int
    at: datetime
    key_id: str
    epsilon: float = Field(description="The per-answer epsilon as configured.")
    delta: float
    outcome: Literal["answered", "refused", "refunded"]


class SpendReport(BaseModel):
    """A context's spend record (never a query's text)."""

    context_id: str
    queries: int = Field(description="The context ledger's answers charged.")
    spent_epsilon: float = Field(description="The context ledger's composed epsilon.")
    delta: float
    by_key: list[SpendByKey]
    recent: list[SpendRowInfo] = Field(description="The newest rows, newest first.")

    @classmethod
    def of(
        cls, ctx: StoredContext, cost: Cost, totals: list[SpendTotal], rows: list[SpendEntry]
    ) -> SpendReport:

        status = Ledger.status(ctx, cost)

        def share(t: SpendTotal) -> float:
            # The same composition as Ledger.status, on this key's charges alone.
            return cost.spent_epsilon(t.mu2, t.answered, status.delta)

        return cls(
            context_id=ctx.id,
            queries=status.queries,
            spent_epsilon=status.spent_epsilon,
            delta=status.delta,
            by_key=[
                SpendByKey(
                    key_id=t.key_id,
                    answered=t.answered,
                    refused=t.refused,
                    refunded=t.refunded,
                    spent_epsilon=share(t) if t.answered else 0.0,
                )
                for t in totals
            ],
            recent=[
                SpendRowInfo(
                    id=r.id,
                    at=r.at,
                    key_id=r.key_id,
                    epsilon=r.epsilon,
                    delta=r.delta,
                    outcome=r.outcome,
                )
                for r in rows
            ],
        )
