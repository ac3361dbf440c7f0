"""Response models and the single error shape. The body of ``POST /v1/contexts`` is
:class:`dpicl.spec.ContextSpec`, each mechanism's settings its own (``dpicl.mechanisms``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from dpicl.domain import (
    MAX_TEXT_CHARS,
    NONBLANK_NO_NUL,
    OptionalInt,
)
from dpicl.privacy.ledger import BudgetStatus, Cost
from dpicl.store.repository import StoredContext


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. budget_exhausted.")
    message: str = Field(description="What is wrong, naming the offending value.")
    param: str | None = Field(default=None, description="Dotted path of the bad field.")


class ErrorResponse(BaseModel):
    error: ErrorBody


#: The error responses a route that answers a query documents (the native, the zero-shot and
#: the white-box answering routes).
ANSWER_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (401, 402, 404, 413, 422, 429, 503)
}


class CostInfo(BaseModel):
    epsilon: float = Field(description="Per-answer epsilon as configured.")
    delta: float
    epsilon_exact: float | None = Field(
        description="Exact epsilon of the mechanism's privacy curve at delta (dp-accounting PLD)."
    )
    epsilon_total: float | None = Field(
        default=None,
        description="DPS-MOZO: the epsilon of the whole context (all its queries answered); "
        "`epsilon` is then what one answer of T_max tokens alone is worth.",
    )

    @classmethod
    def of(cls, cost: Cost) -> CostInfo:
        return cls(
            epsilon=cost.epsilon,
            delta=cost.delta,
            epsilon_exact=cost.epsilon_exact,
            epsilon_total=cost.epsilon_total,
        )


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
    tenant: str | None = Field(default=None, description="The tenant whose keys reach it.")

    @classmethod
    def of(
        cls, ctx: StoredContext, status: BudgetStatus, n_exemplars: int | None = None
    ) -> ContextInfo:
        """``n_exemplars``: given when ``ctx`` was listed without its exemplars."""
        return cls(
            id=ctx.id,
            name=ctx.name,
            task=ctx.task,
            labels=list(ctx.labels),
            n_exemplars=len(ctx.exemplars) if n_exemplars is None else n_exemplars,
            template=ctx.template,
            mechanism=ctx.mechanism,
            budget=ctx.budget,
            spent=BudgetInfo.of(status),
            created_at=ctx.created_at,
            tenant=ctx.tenant,
        )


class ContextList(BaseModel):
    """One page of contexts, oldest first."""

    data: list[ContextInfo]
    next: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page; null on the last page.",
    )


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_id: str = Field(min_length=1, max_length=64)
    query: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_TEXT_CHARS,
            pattern=NONBLANK_NO_NUL,
            description="At least one visible character (not only whitespace or invisible "
            "characters); at most DPICL_MAX_QUERY_CHARS characters.",
        ),
    ]


class ClassifyResponse(BaseModel):
    context_id: str
    label: str
    engine: str
    cost: CostInfo
    budget: BudgetInfo


class HealthLimits(BaseModel):
    """The limits a client must plan its contexts around (this server's settings)."""

    max_budget_epsilon: float = Field(
        description="The largest budget.epsilon a context may have (DPICL_MAX_BUDGET_EPSILON)."
    )
    allow_unbudgeted: bool = Field(
        description="Whether a context may be created without a budget "
        "(DPICL_ALLOW_UNBUDGETED; off in production)."
    )
    max_epsilon: float = Field(
        description="The largest mechanism.epsilon per answer (DPICL_MAX_EPSILON)."
    )
    max_partitions: int = Field(
        description="The most mechanism.partitions a context may have (DPICL_MAX_PARTITIONS)."
    )
    max_exemplars: int = Field(
        description="The most exemplars a context may hold (DPICL_MAX_EXEMPLARS)."
    )
    max_labels: int = Field(description="The most labels a context may have (DPICL_MAX_LABELS).")
    max_query_chars: int = Field(
        description="The most characters of a query (DPICL_MAX_QUERY_CHARS): a client sizes "
        "its queries within it, and an auditor asks queries at it (issue 44)."
    )


class Health(BaseModel):
    status: str
    version: str
    engine: str
    model: str
    simulator: bool
    whitebox: str
    limits: HealthLimits = Field(
        description="What a client must plan its contexts around: an auditor sizes its "
        "budgeted contexts within max_budget_epsilon."
    )


class Readiness(Health):
    database: str = Field(description="ok: the database answered a query.")
    schema_revision: str = Field(description="The database's schema revision (the code's head).")
    embedder: str = Field(description="loaded, or on first use (not loaded at start).")
    torch_threads: int | None = Field(
        default=None, description="torch's intra-op CPU threads (transformers engine only)."
    )
    torch_interop_threads: int | None = Field(
        default=None, description="torch's inter-op CPU threads (transformers engine only)."
    )
    omp_wait_policy: str | None = Field(
        default=None, description="OMP_WAIT_POLICY of the process (None: OpenMP's default)."
    )
    workers: int = Field(
        default=1, description="Server processes answering on this port (DPICL_WORKERS)."
    )
    pid: int = Field(description="The process id of the worker that answered.")
    device: str | None = Field(
        default=None,
        description="The engine's device: the one chosen where DPICL_DEVICE is auto.",
    )
    device_setting: str = Field(
        default="auto",
        description=(
            "DPICL_DEVICE as set. auto: the device was chosen automatically at start (the "
            "CUDA GPU where torch sees one, else the CPU; the transformers engine and the "
            "embedder)."
        ),
    )
    dtype: str | None = Field(
        default=None, description="The dtype of the model's weights (DPICL_DTYPE)."
    )
    load_format: str | None = Field(
        default=None,
        description="auto, or dummy: RANDOM weights for capacity planning (DPICL_LOAD_FORMAT).",
    )
    engine_pid: int | None = Field(
        default=None,
        description="The engine process's id (DPICL_ENGINE_PROCESS); None: in this process.",
    )
    prefix_cache_mib: int | None = Field(
        default=None, description="The prefix cache's budget, MiB (DPICL_PREFIX_CACHE_MIB)."
    )


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_id: str = Field(min_length=1, max_length=64)
    query: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_TEXT_CHARS,
            pattern=NONBLANK_NO_NUL,
            description="At least one visible character (not only whitespace or invisible "
            "characters); at most DPICL_MAX_QUERY_CHARS characters.",
        ),
    ]
    max_tokens: OptionalInt = Field(default=None, ge=1, le=1024)


class GenerateResponse(BaseModel):
    context_id: str
    text: str
    engine: str
    mechanism: str
    cost: CostInfo
    budget: BudgetInfo


class ZeroShotResponse(BaseModel):
    """``POST /v1/zero-shot``: the model's answer to the query in the context's template with
    no exemplar (the zero-shot baseline of a utility audit)."""

    context_id: str
    task: str = Field(description="classification or generation (the context's).")
    label: str | None = Field(
        default=None,
        description="Classification: the label the model scores highest; null where its "
        "scores were not usable.",
    )
    text: str | None = Field(default=None, description="Generation: the generated text.")
    engine: str
