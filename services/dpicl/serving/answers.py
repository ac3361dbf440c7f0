"""Answering a query, whatever surface asked (``/v1/classify``, ``/v1/generate``, the
OpenAI-compatible routes, the white-box routes): the context loaded within the caller's
scope, the query checked, the context's mechanism looked up in the registry and asked for one
answer (charged to the context and to the caller's key), the release counted in the metrics.

Above the mechanisms (it asks the registry), below every route: the routes shape what it
returns and import nothing of each other.
"""

from __future__ import annotations

from dpicl.errors import InvalidRequest
from dpicl.mechanisms.base import Answering, Outcome, TokenSink
from dpicl.mechanisms.registry import mechanism_of, serving
from dpicl.metrics import record_release
from dpicl.pipelines.partitions import check_query
from dpicl.privacy.randomness import secure_rng
from dpicl.store.keys import Principal
from dpicl.store.repository import StoredContext
from dpicl.web.deps import Services, load_context
from dpicl.web.schemas import BudgetInfo, ClassifyRequest, CostInfo, GenerateRequest


def check_serves(ctx: StoredContext, task: str, path: str) -> None:
    """A 422 unless the context's mechanism answers ``task`` (the mechanisms ``path``
    serves)."""
    name = ctx.mechanism_name
    if name not in serving(task):
        raise InvalidRequest(
            f"context {ctx.id} uses mechanism {name!r}; {path} serves "
            + " or ".join(repr(m) for m in serving(task))
            + " contexts",
            param="context_id",
        )


async def answer_outcome(
    context_id: str,
    query: str,
    svc: Services,
    *,
    principal: Principal,
    task: str,
    path: str,
    max_tokens: int | None = None,
    exact: bool = False,
    sink: TokenSink | None = None,
    context: StoredContext | None = None,
) -> Outcome:
    """One answer of the context's mechanism (looked up in the registry), within
    ``principal``'s scope, charged to the context and to ``principal``'s key. ``context``:
    the context ``context_id`` names, when the caller loaded it already (the OpenAI
    surface, which needs its task first), so a request loads it once."""
    query = check_query(query, svc.settings.max_query_chars)
    ctx = context or await load_context(context_id, svc, principal, for_query=True)
    check_serves(ctx, task, path)
    how = Answering(
        runtime=svc,
        ledger=svc.ledger.billed_to(principal),
        rng=secure_rng(),
        max_tokens=max_tokens,
        exact=exact,
        sink=sink,
    )
    out = await mechanism_of(ctx).answer(ctx, query, how)
    released(out)
    return out


async def classify_outcome(
    req: ClassifyRequest,
    svc: Services,
    *,
    principal: Principal,
    context: StoredContext | None = None,
) -> Outcome:
    """Shared by the public, the OpenAI-compatible and the debug route: one answer of a
    classification mechanism (private voting), within ``principal``'s scope, charged to the
    context and to ``principal``'s key (``context``: already loaded, see
    :func:`answer_outcome`)."""
    return await answer_outcome(
        req.context_id,
        req.query,
        svc,
        principal=principal,
        task="classification",
        path="/v1/classify",
        context=context,
    )


def classify_body(out: Outcome, engine: str) -> dict[str, object]:
    return {
        "context_id": out.context.id,
        "label": out.text,
        "engine": engine,
        "cost": CostInfo.of(out.cost),
        "budget": BudgetInfo.of(out.budget),
    }


def released(out: Outcome) -> None:
    """Count an answer's cost in the privacy metrics (dpicl.metrics)."""
    record_release(
        out.context.id, out.cost.epsilon, out.budget.spent_epsilon, out.budget.remaining_epsilon
    )


async def generate_outcome(
    req: GenerateRequest,
    svc: Services,
    *,
    principal: Principal,
    exact: bool = False,
    sink: TokenSink | None = None,
    context: StoredContext | None = None,
) -> Outcome:
    """Shared by the public, the OpenAI-compatible and the debug route: one generation by
    the context's mechanism, within ``principal``'s scope, charged to the context and to
    ``principal``'s key. ``sink``: a mechanism that releases token by token (DPS-MOZO)
    streams to it as it samples (the others release their one answer at the end);
    ``context``: already loaded (see :func:`answer_outcome`)."""
    return await answer_outcome(
        req.context_id,
        req.query,
        svc,
        principal=principal,
        task="generation",
        path="/v1/generate",
        max_tokens=req.max_tokens,
        exact=exact,
        sink=sink,
        context=context,
    )


def generate_body(out: Outcome, engine: str) -> dict[str, object]:
    return {
        "context_id": out.context.id,
        "text": out.text,
        "engine": engine,
        "mechanism": out.context.mechanism_name,
        "cost": CostInfo.of(out.cost),
        "budget": BudgetInfo.of(out.budget),
    }
