"""White-box endpoints. Registered only when ``DPICL_WHITEBOX`` is ``noisy`` or ``internal``
(otherwise the paths do not exist and answer 404); always behind the admin token."""

from __future__ import annotations

from fastapi import APIRouter

from dpicl.api.deps import Admin, Svc
from dpicl.api.routes.inference import ERRORS, classify_body, classify_outcome
from dpicl.api.schemas import ClassifyRequest, DebugClassifyResponse

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
