"""The OpenAI-compatible surface over dpicl's own pipelines (a context is a model).

A request checks itself, names its query and converts itself to the native request that
``/v1/classify`` or ``/v1/generate`` would get (:mod:`dpicl.api.openai.protocol`); the
context is loaded once, and the answer comes from the same outcome functions as theirs
(:func:`~dpicl.serving.answers.classify_outcome`,
:func:`~dpicl.serving.answers.generate_outcome`), so it is charged to the same ledger
by the same rule. Only the shapes differ: OpenAI's body, with dpicl's cost and budget in an
extension object (``dpicl``) and in ``X-DPICL-*`` headers.

Streaming is :mod:`dpicl.api.openai.streaming`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from dpicl.api.openai.protocol import Kind, OpenAIRequest, Query
from dpicl.api.openai.responses import DpiclAnswer, DpiclModel, Model, ModelList, Usage, UsageCost
from dpicl.engines.base import Engine
from dpicl.engines.placement import placement_of
from dpicl.errors import DpiclError, ModelNotFound, NotFound
from dpicl.mechanisms.base import TokenSink
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.serving.answers import classify_outcome, generate_outcome
from dpicl.serving.contexts import cost_of
from dpicl.serving.listing import list_reachable
from dpicl.store.keys import Principal
from dpicl.store.repository import StoredContext
from dpicl.web.deps import Services, load_context
from dpicl.web.schemas import BudgetInfo, ClassifyRequest, CostInfo


@contextmanager
def openai_params(model: str, query_param: str) -> Iterator[None]:
    """Native errors with OpenAI's parameter names (``model`` for the context, the message
    or prompt for the query); an unknown context is ``model_not_found``."""
    try:
        yield
    except NotFound as exc:
        if exc.param != "context_id":
            raise
        raise ModelNotFound(
            f"the model {model[:80]!r} does not exist (no context with that id)", param="model"
        ) from None
    except DpiclError as exc:
        exc.param = {"context_id": "model", "query": query_param}.get(exc.param or "", exc.param)
        raise


@dataclass(frozen=True, slots=True)
class Answer:
    """One released answer in the surface's terms."""

    context: StoredContext
    text: str
    label: str | None
    mechanism: str
    cost: Cost
    budget: BudgetStatus
    finish_reason: Literal["stop", "length"]
    completion_tokens: int


async def answer(
    req: OpenAIRequest,
    query: Query,
    svc: Services,
    *,
    principal: Principal,
    sink: TokenSink | None = None,
) -> Answer:
    """One answer through the native pipelines (same charge as /v1/classify, /v1/generate,
    to the context and to ``principal``'s key, within its scope). The context is loaded
    once, here, and handed to the native outcome."""
    with openai_params(req.model, query.param):
        ctx = await load_context(req.model, svc, principal, for_query=True)
        native = req.to_native(ctx.task, query)
        if isinstance(native, ClassifyRequest):
            out = await classify_outcome(native, svc, principal=principal, context=ctx)
            label: str | None = out.text
        else:
            out = await generate_outcome(native, svc, principal=principal, sink=sink, context=ctx)
            label = None
    return Answer(
        context=out.context,
        text=out.text,
        label=label,
        mechanism=out.context.mechanism_name,
        cost=out.cost,
        budget=out.budget,
        finish_reason=out.finish_reason,
        completion_tokens=out.completion_tokens,
    )


# ------------------------------------------------------------------------------ shapes


def usage_cost(cost: Cost, budget: BudgetStatus) -> UsageCost:
    """The cost of this answer and the budget left, named as the X-DPICL-* headers."""
    return UsageCost(
        epsilon_spent=cost.epsilon,
        delta_spent=cost.delta,
        context_epsilon_spent=budget.spent_epsilon,
        delta=budget.delta,
        epsilon_remaining=budget.remaining_epsilon,
        queries_remaining=budget.remaining_queries,
    )


def cost_headers(cost: Cost, budget: BudgetStatus) -> dict[str, str]:
    """The same figures as headers, for clients that ignore extensions: ``epsilon_spent`` is
    ``X-DPICL-Epsilon-Spent``; a figure the budget does not have is left out."""
    return {
        "X-DPICL-" + "-".join(w.capitalize() for w in name.split("_")): repr(value)
        for name, value in usage_cost(cost, budget).model_dump().items()
        if value is not None
    }


def extension(a: Answer, engine: str) -> DpiclAnswer:
    return DpiclAnswer(
        context_id=a.context.id,
        task=a.context.task,
        mechanism=a.mechanism,
        engine=engine,
        label=a.label,
        cost=CostInfo.of(a.cost),
        budget=BudgetInfo.of(a.budget),
    )


def usage_of(a: Answer) -> Usage:
    return Usage(
        prompt_tokens=0,
        completion_tokens=a.completion_tokens,
        total_tokens=a.completion_tokens,
        dpicl=usage_cost(a.cost, a.budget),
    )


def completion_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def completion_body(kind: Kind, a: Answer, engine: str) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": a.finish_reason, "logprobs": None}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": a.text, "refusal": None}
    else:
        choice["text"] = a.text
    return {
        "id": completion_id(kind),
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": a.context.id,
        "choices": [choice],
        "usage": usage_of(a).model_dump(),
        "system_fingerprint": None,
        "dpicl": extension(a, engine).model_dump(mode="json"),
    }


def model_of(ctx: StoredContext, engine: Engine) -> Model:
    cost = cost_of(ctx)
    placed = placement_of(engine)
    return Model(
        id=ctx.id,
        created=int(ctx.created_at.timestamp()),
        dpicl=DpiclModel(
            name=ctx.name,
            task=ctx.task,
            labels=list(ctx.labels),
            mechanism=ctx.mechanism_name,
            epsilon=cost.epsilon,
            delta=cost.delta,
            epsilon_exact=cost.epsilon_exact,
            budget=ctx.budget,
            spent=BudgetInfo.of(Ledger.status(ctx, cost)),
            engine=engine.name,
            base_model=engine.model,
            dtype=placed["dtype"],
            load_format=placed["load_format"],
        ),
    )


async def one_model(model_id: str, svc: Services, principal: Principal) -> Model:
    with openai_params(model_id, "model"):
        return model_of(await load_context(model_id, svc, principal, exemplars=False), svc.engine)


async def model_page(
    svc: Services, principal: Principal, limit: int, after: str | None
) -> ModelList:
    """One page of the models (contexts) ``principal`` reaches, oldest first, after the
    context ``after`` (what ``GET /v1/contexts`` lists for the same key)."""
    key = None
    if after is not None:
        try:
            # Scoped like every lookup: an id outside the key's scope reads as unknown.
            ctx = await load_context(after, svc, principal, exemplars=False)
        except NotFound:
            # A 404, as for the model itself: the id has the form of one (the schema says
            # so) and names no model this key lists (deleted since, or never seen).
            raise ModelNotFound(
                f"after={after[:80]!r}: no model this key lists has that id (pass the "
                "last_id of the previous page)",
                param="after",
            ) from None
        key = (ctx.created_at, ctx.id)
    listed, last = await list_reachable(svc, principal, limit, key)
    data = [model_of(c.context, svc.engine) for c in listed]
    return ModelList(
        data=data,
        has_more=last is not None,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
