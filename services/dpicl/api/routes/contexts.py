from __future__ import annotations

from fastapi import APIRouter, Response, status

from dpicl.api.deps import Admin, Svc, load_context
from dpicl.api.schemas import (
    BudgetInfo,
    ContextInfo,
    ContextList,
    CostInfo,
    ErrorResponse,
    SynthesizeRequest,
    SynthesizeResponse,
)
from dpicl.domain import ContextSpec
from dpicl.errors import InvalidRequest, NotFound
from dpicl.pipelines.contexts import cost_of, create_context
from dpicl.pipelines.mozo import synthesize
from dpicl.privacy.ledger import Ledger
from dpicl.privacy.randomness import secure_rng
from dpicl.store.repository import StoredContext, is_context_id

router = APIRouter(
    prefix="/v1/contexts",
    tags=["contexts"],
    dependencies=[Admin],
    responses={401: {"model": ErrorResponse}},
)


def _info(ctx: StoredContext) -> ContextInfo:
    return ContextInfo.of(ctx, Ledger.status(ctx, cost_of(ctx)))


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ContextInfo)
async def create(spec: ContextSpec, svc: Svc) -> ContextInfo:
    """Create a context: private exemplars guarded by a DP mechanism and an optional budget."""
    return _info(await create_context(spec, svc.repo, svc.settings))


@router.get("", response_model=ContextList)
async def list_contexts(svc: Svc) -> ContextList:
    """List contexts with their mechanisms and budgets (never their exemplars)."""
    return ContextList(data=[_info(c) for c in await svc.repo.list()])


@router.get("/{context_id}", response_model=ContextInfo, responses={404: {"model": ErrorResponse}})
async def get(context_id: str, svc: Svc) -> ContextInfo:
    """One context's metadata and the budget it has spent (never its exemplars)."""
    return _info(await load_context(context_id, svc))


@router.delete(
    "/{context_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={404: {"model": ErrorResponse}},
)
async def delete(context_id: str, svc: Svc) -> Response:
    """Delete a context and its ledger."""
    if not is_context_id(context_id) or not await svc.repo.delete(context_id):
        raise NotFound(f"no context with id {context_id[:80]!r}", param="context_id")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{context_id}/synthesize",
    response_model=SynthesizeResponse,
    status_code=status.HTTP_201_CREATED,
    responses={403: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
)
async def synthesize_context(
    context_id: str, req: SynthesizeRequest, svc: Svc
) -> SynthesizeResponse:
    """DPS-MOZO offline mode: DP outputs for public inputs, stored as a free-to-serve context."""
    limit = svc.settings.max_query_chars
    for i, text in enumerate(req.inputs):
        if not text.strip() or len(text) > limit:
            raise InvalidRequest(
                f"input {i} must be non-blank and at most {limit} characters (it has {len(text)})",
                param=f"inputs.{i}",
            )
    ctx = await load_context(context_id, svc)
    out = await synthesize(
        ctx,
        req.inputs,
        engine=svc.engine,
        ledger=svc.ledger,
        repo=svc.repo,
        rng=secure_rng(),
        name=req.name,
    )
    derived = out.derived
    return SynthesizeResponse(
        context=ContextInfo.of(derived, Ledger.status(derived, cost_of(derived))),
        derived_from=out.source.id,
        privacy_cost=0.0,
        note=(
            f"{len(out.outputs)} outputs were generated with DPS-MOZO, each charged one query "
            f"of {out.source.id}; serving {derived.id} by few-shot ICL costs no further privacy"
        ),
        source_cost=CostInfo.of(out.cost),
        source_budget=BudgetInfo.of(out.budget),
    )
