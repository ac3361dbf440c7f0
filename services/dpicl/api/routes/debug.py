"""White-box endpoints. Registered only when ``DPICL_WHITEBOX`` is ``noisy`` or ``internal``
(otherwise the paths do not exist and answer 404); always behind the admin token."""

from __future__ import annotations

from fastapi import APIRouter

from dpicl.api.deps import Admin, Svc
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

router = APIRouter(prefix="/v1/debug", tags=["debug"], dependencies=[Admin], responses=ERRORS)


@router.post("/classify", response_model=DebugClassifyResponse)
async def debug_classify(req: ClassifyRequest, svc: Svc) -> DebugClassifyResponse:
    """Private voting with its noisy votes (and, at internal, the clean votes); charged as usual."""
    out = await classify_outcome(req, svc)
    labels = out.context.labels
    rel = out.release
    body = classify_body(out, svc.engine.name) | {
        "whitebox": svc.settings.whitebox,
        "sigma": out.sigma,
        "noisy_votes": {lab: float(v) for lab, v in zip(labels, rel.noisy_counts, strict=True)},
    }
    if svc.settings.whitebox == "internal":
        body["clean_votes"] = {lab: int(v) for lab, v in zip(labels, rel.clean_counts, strict=True)}
        body["partition_votes"] = [labels[int(v)] for v in rel.partition_votes]
    return DebugClassifyResponse.model_validate(body)


@router.post("/generate", response_model=DebugGenerateResponse)
async def debug_generate(req: GenerateRequest, svc: Svc) -> DebugGenerateResponse:
    """ESA generation with its noisy mean and candidates (at internal, partition outputs)."""
    out = await generate_outcome(req, svc)
    rel = out.release
    body = generate_body(out, svc.engine.name) | {
        "whitebox": svc.settings.whitebox,
        "sigma": out.sigma,
        "noisy_mean": rel.noisy_mean.tolist(),
        "candidates": out.candidates,
        "distances": rel.distances.tolist(),
    }
    if svc.settings.whitebox == "internal":
        body["clean_mean"] = rel.clean_mean.tolist()
        body["partition_texts"] = out.partition_texts
        body["partition_embeddings"] = out.partition_embeddings.tolist()
    return DebugGenerateResponse.model_validate(body)
