"""The OpenAI-compatible surface over dpicl's own pipelines (a context is a model).

A request is checked (:func:`refuse_unsupported`), its query taken (the last message, which
must be the user's, or the prompt) and turned into the native request that ``/v1/classify``
or ``/v1/generate`` would get; the answer comes from the same outcome functions as theirs
(:func:`~dpicl.api.routes.inference.classify_outcome`,
:func:`~dpicl.api.routes.inference.generate_outcome`), so it is charged to the same ledger
by the same rule. Only the shapes differ: OpenAI's body, with dpicl's cost and budget in an
extension object (``dpicl``) and in ``X-DPICL-*`` headers.

Streaming is :mod:`dpicl.api.openai_stream`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from dpicl.api.deps import Services, load_context
from dpicl.api.openai_schemas import (
    NEUTRAL,
    REFUSED,
    ChatCompletionRequest,
    CompletionRequest,
    DpiclAnswer,
    DpiclModel,
    Model,
    ModelList,
    Usage,
)
from dpicl.api.routes.contexts import list_reachable
from dpicl.api.routes.inference import classify_outcome, generate_outcome
from dpicl.api.schemas import BudgetInfo, ClassifyRequest, CostInfo, GenerateRequest
from dpicl.errors import (
    DpiclError,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    UnsupportedParameter,
)
from dpicl.mechanisms.base import TokenSink
from dpicl.pipelines.contexts import cost_of
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.store.keys import Principal
from dpicl.store.repository import StoredContext

Kind = Literal["chat", "text"]
OpenAIRequest = ChatCompletionRequest | CompletionRequest

_WHY = {
    "logprobs": "token log-probabilities are un-noised internals of the model, which a "
    "differentially private answer never releases",
    "top_logprobs": "token log-probabilities are un-noised internals of the model, which a "
    "differentially private answer never releases",
    "echo": "dpicl releases only the mechanism's answer",
    "n": "each answer is a separate DP release, charged on its own; send n requests",
    "best_of": "each answer is a separate DP release, charged on its own",
    "seed": "DP noise and sampling are seeded from the operating system's entropy, never "
    "by a client",
    "stop": "the mechanisms release their answer whole",
    "logit_bias": "the mechanism's distribution cannot be changed by a client",
    "response_format": "a context answers with its label or a DP-generated text",
}


def refuse_unsupported(req: BaseModel) -> None:
    """A 400 naming the first parameter that would leak or that cannot be honoured."""
    for name in REFUSED:
        if name not in type(req).model_fields:
            continue
        value = getattr(req, name)
        neutral = NEUTRAL.get(name, (None,))
        # ``True == 1``: a boolean is only neutral where ``False`` is.
        if any(type(value) is type(v) and value == v for v in neutral) or value is None:
            continue
        shown = json.dumps(value)[:80] if value is not None else "null"
        why = _WHY.get(name, "a context answers with its label or a DP-generated text")
        raise UnsupportedParameter(f"{name}={shown} is not supported by dpicl: {why}", param=name)


def chat_query(req: ChatCompletionRequest) -> tuple[str, str]:
    """(the query, its parameter path): the last message, which must be the user's."""
    i = len(req.messages) - 1
    last = req.messages[i]
    if last.role != "user":
        raise InvalidRequest(
            f"messages.{i}.role: the last message is the query and must have role 'user' "
            f"(got {last.role!r})",
            param=f"messages.{i}.role",
        )
    content = last.content
    if isinstance(content, str):
        return content, f"messages.{i}.content"
    if not content:
        raise InvalidRequest(
            f"messages.{i}.content: the last user message has no text",
            param=f"messages.{i}.content",
        )
    texts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise UnsupportedParameter(
                f"messages.{i}.content.{j}: only parts of type 'text' with a string 'text' are "
                f"supported (got type {str(part.get('type'))[:40]!r})",
                param=f"messages.{i}.content.{j}.type",
            )
        texts.append(part["text"])
    return "\n".join(texts), f"messages.{i}.content"


def completion_query(req: CompletionRequest) -> tuple[str, str]:
    prompt = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], "prompt"
    if isinstance(prompt, str):
        return prompt, "prompt"
    raise UnsupportedParameter(
        f"prompt must be one string (or a list holding one); got {json.dumps(prompt)[:80]}: "
        "token ids are not accepted, and several prompts would be several DP releases "
        "(send one request each)",
        param="prompt",
    )


def max_tokens_of(req: OpenAIRequest) -> int | None:
    other = req.max_completion_tokens if isinstance(req, ChatCompletionRequest) else None
    if req.max_tokens is not None and other is not None and req.max_tokens != other:
        raise InvalidRequest(
            f"max_tokens={req.max_tokens} and max_completion_tokens={other} differ; send one",
            param="max_completion_tokens",
        )
    return req.max_tokens if req.max_tokens is not None else other


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


def _native(cls: type[BaseModel], body: dict[str, Any], query_param: str) -> Any:
    """The native request model, its validation errors named in OpenAI's terms."""
    try:
        return cls.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        param = {"context_id": "model", "query": query_param}.get(field, field)
        what = "the query" if field == "query" else param
        msg = str(err["msg"]).lower()
        if err["type"] == "string_pattern_mismatch":
            msg = (
                "must contain a visible character (not only whitespace, control or invisible "
                "characters) and no NUL"
            )
        raise InvalidRequest(f"{param}: {what} {msg}", param=param) from None


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
    svc: Services,
    *,
    principal: Principal,
    sink: TokenSink | None = None,
    query: tuple[str, str],
) -> Answer:
    """One answer through the native pipelines (same charge as /v1/classify, /v1/generate,
    to the context and to ``principal``'s key, within its scope)."""
    text, query_param = query
    with openai_params(req.model, query_param):
        ctx = await load_context(req.model, svc, principal, for_query=True)
        if ctx.task == "classification":
            native = _native(ClassifyRequest, {"context_id": req.model, "query": text}, query_param)
            out = await classify_outcome(native, svc, principal=principal)
            label: str | None = out.text
        else:
            body: dict[str, Any] = {"context_id": req.model, "query": text}
            limit = max_tokens_of(req)
            if limit is not None:
                body["max_tokens"] = limit
            out = await generate_outcome(
                _native(GenerateRequest, body, query_param), svc, principal=principal, sink=sink
            )
            label = None
    return Answer(
        context=out.context,
        text=out.text,
        label=label,
        mechanism=str(out.context.mechanism["name"]),
        cost=out.cost,
        budget=out.budget,
        finish_reason=out.finish_reason,
        completion_tokens=out.completion_tokens,
    )


# ------------------------------------------------------------------------------ shapes


def cost_headers(cost: Cost, budget: BudgetStatus) -> dict[str, str]:
    """The cost of this answer and the budget left, for clients that ignore extensions."""
    out = {
        "X-DPICL-Epsilon-Spent": repr(cost.epsilon),
        "X-DPICL-Delta-Spent": repr(cost.delta),
        "X-DPICL-Context-Epsilon-Spent": repr(budget.spent_epsilon),
        "X-DPICL-Delta": repr(budget.delta),
    }
    if budget.remaining_epsilon is not None:
        out["X-DPICL-Epsilon-Remaining"] = repr(budget.remaining_epsilon)
    if budget.remaining_queries is not None:
        out["X-DPICL-Queries-Remaining"] = str(budget.remaining_queries)
    return out


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
        prompt_tokens=0, completion_tokens=a.completion_tokens, total_tokens=a.completion_tokens
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


def model_of(ctx: StoredContext) -> Model:
    cost = cost_of(ctx)
    return Model(
        id=ctx.id,
        created=int(ctx.created_at.timestamp()),
        dpicl=DpiclModel(
            name=ctx.name,
            task=ctx.task,
            labels=list(ctx.labels),
            mechanism=str(ctx.mechanism["name"]),
            epsilon=cost.epsilon,
            delta=cost.delta,
            epsilon_exact=cost.epsilon_exact,
            budget=ctx.budget,
            spent=BudgetInfo.of(Ledger.status(ctx, cost)),
        ),
    )


async def one_model(model_id: str, svc: Services, principal: Principal) -> Model:
    with openai_params(model_id, "model"):
        return model_of(await load_context(model_id, svc, principal))


async def model_page(
    svc: Services, principal: Principal, limit: int, after: str | None
) -> ModelList:
    """One page of the models (contexts) ``principal`` reaches, oldest first, after the
    context ``after`` (what ``GET /v1/contexts`` lists for the same key)."""
    key = None
    if after is not None:
        try:
            # Scoped like every lookup: an id outside the key's scope reads as unknown.
            ctx = await load_context(after, svc, principal)
        except NotFound:
            raise InvalidRequest(
                f"after={after[:80]!r} is not a model id this server lists", param="after"
            ) from None
        key = (ctx.created_at, ctx.id)
    listed, last = await list_reachable(svc, principal, limit, key)
    data = [model_of(c.context) for c in listed]
    return ModelList(
        data=data,
        has_more=last is not None,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
