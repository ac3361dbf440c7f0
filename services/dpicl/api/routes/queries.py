"""``POST /v1/classify`` and ``POST /v1/generate``: a query answered, in dpicl's own shapes,
over the answering service (:mod:`dpicl.serving.answers`)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from dpicl.api.disconnect import unless_disconnected
from dpicl.serving.answers import classify_body, classify_outcome, generate_body, generate_outcome
from dpicl.web.deps import Caller, services_of
from dpicl.web.schemas import (
    ANSWER_ERRORS,
    ClassifyRequest,
    ClassifyResponse,
    GenerateRequest,
    GenerateResponse,
)

router = APIRouter(prefix="/v1", tags=["inference"], responses=ANSWER_ERRORS)


# The hot routes take the services from the request and their caller from one dependency
# (``Caller``, which also declares the bearer scheme): each nested dependency FastAPI solves
# costs about as much as a database round trip on the oracle engine (issue 30).
@router.post("/classify", response_model=ClassifyResponse)
async def classify(req: ClassifyRequest, request: Request, caller: Caller) -> ClassifyResponse:
    """Classify a query with private voting; returns the label, its cost and the budget left."""
    svc = services_of(request)
    out = await unless_disconnected(request, classify_outcome(req, svc, principal=caller))
    return ClassifyResponse.model_validate(classify_body(out, svc.engine.name))


@router.post("/generate", response_model=GenerateResponse)
async def generate(req: GenerateRequest, request: Request, caller: Caller) -> GenerateResponse:
    """Generate text (ESA, DPS-MOZO or public few-shot); returns it, its cost and budget left."""
    svc = services_of(request)
    out = await unless_disconnected(request, generate_outcome(req, svc, principal=caller))
    return GenerateResponse.model_validate(generate_body(out, svc.engine.name))
