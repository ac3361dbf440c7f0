"""The OpenAI-compatible routes: a context is a model (logic in :mod:`.serving` and
:mod:`.streaming`, the request and response models in :mod:`.protocol`).

Errors here are in OpenAI's shape (:mod:`.errors`); authentication is the native inference
routes' (a user key, or the admin token).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from dpicl.api.disconnect import unless_disconnected
from dpicl.api.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIRequest
from dpicl.api.openai.responses import ChatCompletion, Model, ModelList, TextCompletion
from dpicl.api.openai.serving import answer, completion_body, cost_headers, model_page, one_model
from dpicl.api.openai.streaming import stream_answer
from dpicl.domain import MAX_LIST_LIMIT
from dpicl.store.keys import Principal
from dpicl.web.deps import Caller, ModelPath, Svc, only_query_params

_ERROR = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {
                            "message": {"type": "string"},
                            "type": {"type": "string"},
                            "param": {"type": ["string", "null"]},
                            "code": {"type": "string"},
                        },
                    }
                },
            }
        }
    }
}

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "A bad or unsupported parameter (OpenAI's error shape)."} | _ERROR,
    401: {"description": "No valid API key."} | _ERROR,
    404: {"description": "model_not_found: no context with that id."} | _ERROR,
    402: {
        "description": "budget_exhausted: nothing was charged; no Retry-After, "
        "x-should-retry: false."
    }
    | _ERROR,
    429: {"description": "rate_limited: the key's rate limit; Retry-After says when."} | _ERROR,
}

_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion; with `stream: true`, server-sent events of chunks "
        "ending with `data: [DONE]`. Headers X-DPICL-Epsilon-Spent, X-DPICL-Delta-Spent, "
        "X-DPICL-Context-Epsilon-Spent, X-DPICL-Delta, X-DPICL-Epsilon-Remaining and "
        "X-DPICL-Queries-Remaining (the last two when the context has a budget).",
        "content": {"text/event-stream": {}},
    }
}

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERRORS)


@router.get("/models", response_model=ModelList, dependencies=[only_query_params("limit", "after")])
async def list_models(
    svc: Svc,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="Models per page.")] = (
        MAX_LIST_LIMIT
    ),
    after: Annotated[
        str | None,
        Query(
            pattern=r"^ctx_[0-9a-f]{24}$",
            description="The `last_id` of the previous page (a model id; 404 when no model "
            "this key lists has it).",
        ),
    ] = None,
) -> ModelList:
    """List the contexts this key may query as OpenAI models, with their budget left."""
    return await model_page(svc, caller, limit, after)


@router.get("/models/{model}", response_model=Model)
async def get_model(model: ModelPath, svc: Svc, caller: Caller) -> Model:
    """One context as an OpenAI model."""
    return await one_model(model, svc, caller)


async def _complete(req: OpenAIRequest, svc: Svc, caller: Principal, request: Request) -> Response:
    # Checked before anything is loaded or charged, and before a stream starts.
    req.refuse_unsupported()
    query = req.query()
    if req.stream:
        return await stream_answer(req, query, svc, caller)
    # Stopped if its client leaves, as a stream is (api/disconnect.py).
    a = await unless_disconnected(request, answer(req, query, svc, principal=caller))
    return JSONResponse(
        completion_body(req.kind, a, svc.engine.name), headers=cost_headers(a.cost, a.budget)
    )


@router.post("/chat/completions", response_model=ChatCompletion, responses=_STREAM)
async def chat_completions(
    req: ChatCompletionRequest, svc: Svc, caller: Caller, request: Request
) -> Response:
    """Answer the last user message with the context `model` (its label or a DP text)."""
    return await _complete(req, svc, caller, request)


@router.post("/completions", response_model=TextCompletion, responses=_STREAM)
async def completions(
    req: CompletionRequest, svc: Svc, caller: Caller, request: Request
) -> Response:
    """Answer `prompt` with the context `model` (its label or a DP text)."""
    return await _complete(req, svc, caller, request)
