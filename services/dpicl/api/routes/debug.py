"""White-box endpoints. Registered only when ``DPICL_WHITEBOX`` is ``noisy`` or ``internal``
(otherwise the paths do not exist and answer 404); always behind the admin token. What each
mechanism shows is its own ``debug_view`` (:mod:`dpicl.mechanisms.registry`)."""

from __future__ import annotations

from fastapi import APIRouter

from dpicl.api.deps import Admin, AdminCaller, Svc
from dpicl.api.routes.inference import (
    ERRORS,
    classify_body,
    classify_outcome,
    generate_body,
    generate_outcome,
)
from dpicl.api.schemas import (
    ClassifyRequest,
    DebugClassifyResponse,
    DebugGenerateResponse,
    GenerateRequest,
)
from dpicl.errors import InvalidRequest
from dpicl.mechanisms.base import Outcome
from dpicl.mechanisms.registry import mechanism_of

router = APIRouter(prefix="/v1/debug", tags=["debug"], dependencies=[Admin], responses=ERRORS)


def _view(out: Outcome, whitebox: str) -> dict[str, object]:
    view = mechanism_of(out.context).debug_view(out, whitebox)
    if view is None:
        raise InvalidRequest(
            f"context {out.context.id} uses mechanism {out.context.mechanism['name']!r}, "
            "which has no private internals",
            param="context_id",
        )
    return {"whitebox": whitebox, **view}


@router.post("/classify", response_model=DebugClassifyResponse)
async def debug_classify(
    req: ClassifyRequest, svc: Svc, caller: AdminCaller
) -> DebugClassifyResponse:
    """Private voting with its noisy votes (and, at internal, the clean votes); charged as usual."""
    out = await classify_outcome(req, svc, principal=caller)
    body = classify_body(out, svc.engine.name) | _view(out, svc.settings.whitebox)
    return DebugClassifyResponse.model_validate(body)


@router.post("/generate", response_model=DebugGenerateResponse)
async def debug_generate(
    req: GenerateRequest, svc: Svc, caller: AdminCaller
) -> DebugGenerateResponse:
    """ESA or DPS-MOZO generation with its noisy internals (more at internal); charged as usual."""
    internal = svc.settings.whitebox == "internal"
    out = await generate_outcome(req, svc, principal=caller, exact=internal)
    body = generate_body(out, svc.engine.name) | _view(out, svc.settings.whitebox)
    return DebugGenerateResponse.model_validate(body)
