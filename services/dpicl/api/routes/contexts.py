from __future__ import annotations

from fastapi import APIRouter, Response, status

from dpicl.api.deps import Admin, Svc, load_context
from dpicl.api.schemas import ContextInfo, ContextList, ErrorResponse
from dpicl.domain import ContextSpec
from dpicl.errors import NotFound
from dpicl.pipelines.contexts import cost_of, create_context
from dpicl.privacy.ledger import Ledger
from dpicl.store.repository import StoredContext

router = APIRouter(
    prefix="/v1/contexts",
    tags=["contexts"],
    dependencies=[Admin],
    responses={401: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
)


def _info(ctx: StoredContext) -> ContextInfo:
    return ContextInfo.of(ctx, Ledger.status(ctx, cost_of(ctx)))


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ContextInfo)
async def create(spec: ContextSpec, svc: Svc) -> ContextInfo:
    """Create a context: private exemplars guarded by a DP mechanism and an optional budget."""
    return _info(await create_context(spec, svc.repo))


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
    if not await svc.repo.delete(context_id):
        raise NotFound(f"no context with id {context_id!r}", param="context_id")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
