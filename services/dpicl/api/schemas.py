"""Response models and the single error shape. Request models for contexts live in
:mod:`dpicl.domain` (they are the domain's own validated settings)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dpicl.privacy.ledger import BudgetStatus, Cost
from dpicl.store.repository import StoredContext


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. budget_exhausted.")
    message: str = Field(description="What is wrong, naming the offending value.")
    param: str | None = Field(default=None, description="Dotted path of the bad field.")


class ErrorResponse(BaseModel):
    error: ErrorBody


class CostInfo(BaseModel):
    epsilon: float = Field(description="Per-answer epsilon as configured.")
    delta: float
    epsilon_exact: float | None = Field(
        description="Exact epsilon of the mechanism's privacy curve at delta (dp-accounting PLD)."
    )

    @classmethod
    def of(cls, cost: Cost) -> CostInfo:
        return cls(epsilon=cost.epsilon, delta=cost.delta, epsilon_exact=cost.epsilon_exact)


class BudgetInfo(BaseModel):
    queries: int = Field(description="Answers charged so far.")
    spent_epsilon: float = Field(description="Exact composed epsilon spent, at `delta`.")
    delta: float
    remaining_epsilon: float | None = Field(description="Budget epsilon minus spent; null if none.")
    remaining_queries: int | None = Field(description="Answers of this cost that still fit.")

    @classmethod
    def of(cls, status: BudgetStatus) -> BudgetInfo:
        return cls(
            queries=status.queries,
            spent_epsilon=status.spent_epsilon,
            delta=status.delta,
            remaining_epsilon=status.remaining_epsilon,
            remaining_queries=status.remaining_queries,
        )


class ContextInfo(BaseModel):
    """A context's metadata and ledger. Exemplars never leave the server."""

    id: str
    name: str | None
    task: str
    labels: list[str]
    n_exemplars: int
    template: str
    mechanism: dict[str, Any]
    budget: dict[str, float] | None
    spent: BudgetInfo
    created_at: datetime

    @classmethod
    def of(cls, ctx: StoredContext, status: BudgetStatus) -> ContextInfo:
        return cls(
            id=ctx.id,
            name=ctx.name,
            task=ctx.task,
            labels=list(ctx.labels),
            n_exemplars=len(ctx.exemplars),
            template=ctx.template,
            mechanism=ctx.mechanism,
            budget=ctx.budget,
            spent=BudgetInfo.of(status),
            created_at=ctx.created_at,
        )


class ContextList(BaseModel):
    data: list[ContextInfo]


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_id: str = Field(min_length=1, max_length=64)
    query: str


class ClassifyResponse(BaseModel):
    context_id: str
    label: str
    engine: str
    cost: CostInfo
    budget: BudgetInfo


class DebugClassifyResponse(ClassifyResponse):
    whitebox: str = Field(description="noisy or internal")
    sigma: float
    noisy_votes: dict[str, float]
    clean_votes: dict[str, int] | None = None
    partition_votes: list[str] | None = None


class Health(BaseModel):
    status: str
    version: str
    engine: str
    model: str
    simulator: bool
    whitebox: str


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_id: str = Field(min_length=1, max_length=64)
    query: str
    max_tokens: int | None = Field(default=None, ge=1, le=1024)


class GenerateResponse(BaseModel):
    context_id: str
    text: str
    engine: str
    mechanism: str
    cost: CostInfo
    budget: BudgetInfo


class DebugGenerateResponse(GenerateResponse):
    whitebox: str
    sigma: float
    noisy_mean: list[float]
    candidates: list[str]
    distances: list[float]
    clean_mean: list[float] | None = None
    partition_texts: list[str] | None = None
    partition_embeddings: list[list[float]] | None = None
