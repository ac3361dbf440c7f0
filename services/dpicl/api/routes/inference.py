from __future__ import annotations

from fastapi import APIRouter

from dpicl.api.deps import Services, Svc, User, load_context
from dpicl.api.schemas import (
    BudgetInfo,
    ClassifyRequest,
    ClassifyResponse,
    CostInfo,
    ErrorResponse,
)
from dpicl.errors import InvalidRequest
from dpicl.pipelines.voting import VotingOutcome, check_query, run_voting
from dpicl.privacy.randomness import secure_rng

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (401, 403, 404, 413, 422, 503)
}

router = APIRouter(prefix="/v1", tags=["inference"], responses=ERRORS)


async def classify_outcome(req: ClassifyRequest, svc: Services) -> VotingOutcome:
    """Shared by the public and the debug route: one private-voting answer."""
    query = check_query(req.query, svc.settings.max_query_chars)
    ctx = await load_context(req.context_id, svc)
    if ctx.mechanism.get("name") != "voting":
        raise InvalidRequest(
            f"context {ctx.id} uses mechanism {ctx.mechanism.get('name')!r}; "
            "/v1/classify serves 'voting' contexts",
            param="context_id",
        )
    return await run_voting(
        ctx, query, engine=svc.engine, ledger=svc.ledger, repo=svc.repo, rng=secure_rng()
    )


def classify_body(out: VotingOutcome, engine: str) -> dict[str, object]:
    return {
        "context_id": out.context.id,
        "label": out.label,
        "engine": engine,
        "cost": CostInfo.of(out.cost),
        "budget": BudgetInfo.of(out.budget),
    }


@router.post("/classify", response_model=ClassifyResponse, dependencies=[User])
async def classify(req: ClassifyRequest, svc: Svc) -> ClassifyResponse:
    """Classify a query with private voting; returns the label, its cost and the budget left."""
    out = await classify_outcome(req, svc)
    return ClassifyResponse.model_validate(classify_body(out, svc.engine.name))
