from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from dpicl.api.spend_schemas import SpendReport
from dpicl.domain import MAX_LIST_LIMIT
from dpicl.errors import NotFound
from dpicl.metrics import forget_context
from dpicl.privacy.ledger import Ledger
from dpicl.serving.contexts import cost_of, create_context
from dpicl.serving.listing import CURSOR_PATTERN, decode_cursor, encode_cursor, list_reachable
from dpicl.spec import ContextSpec
from dpicl.store.keys import ADMIN, spend_of
from dpicl.store.repository import StoredContext, is_context_id
from dpicl.web.deps import (
    Admin,
    Caller,
    ContextIdPath,
    Svc,
    cursor_query,
    load_context,
    only_query_params,
)
from dpicl.web.schemas import (
    ContextInfo,
    ContextList,
    ErrorResponse,
)

#: Contexts per page when `limit` is not given.
DEFAULT_LIST_LIMIT = 100
LIST_PARAMS = ("limit", "cursor")

# Every route is the admin's but the listing, which a key may call (it lists what the key
# reaches).
router = APIRouter(
    prefix="/v1/contexts",
    tags=["contexts"],
    responses={401: {"model": ErrorResponse}},
)


def _info(ctx: StoredContext) -> ContextInfo:
    return ContextInfo.of(ctx, Ledger.status(ctx, cost_of(ctx)))


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=ContextInfo, dependencies=[Admin]
)
async def create(spec: ContextSpec, svc: Svc) -> ContextInfo:
    """Create a context: private exemplars guarded by a DP mechanism and an optional budget."""
    return _info(await create_context(spec, svc.repo, svc.settings))


@router.get("", response_model=ContextList, dependencies=[only_query_params(*LIST_PARAMS)])
async def list_contexts(
    svc: Svc,
    caller: Caller,
    limit: Annotated[
        int, Query(ge=1, le=MAX_LIST_LIMIT, description="Contexts per page.")
    ] = DEFAULT_LIST_LIMIT,
    cursor: Annotated[
        str | None,
        # The form in the schema only: decode_cursor's 422 says more than a mismatch.
        cursor_query(
            "The `next` of the previous page; omit for the first.", pattern=CURSOR_PATTERN
        ),
    ] = None,
) -> ContextList:
    """List the contexts the caller's key reaches, oldest first, a page at a time."""
    after = decode_cursor(cursor) if cursor is not None else None
    listed, last = await list_reachable(svc, caller, limit, after)
    return ContextList(
        data=[
            ContextInfo.of(c.context, Ledger.status(c.context, cost_of(c.context)), c.n_exemplars)
            for c in listed
        ],
        next=encode_cursor(last) if last is not None else None,
    )


@router.get(
    "/{context_id}",
    response_model=ContextInfo,
    responses={404: {"model": ErrorResponse}},
    dependencies=[Admin],
)
async def get(context_id: ContextIdPath, svc: Svc) -> ContextInfo:
    """One context's metadata and the budget it has spent (never its exemplars)."""
    return _info(await load_context(context_id, svc, ADMIN))


#: Spend rows shown by default and at most.
DEFAULT_SPEND_ROWS = 100
MAX_SPEND_ROWS = 1000


@router.get(
    "/{context_id}/spend",
    response_model=SpendReport,
    responses={404: {"model": ErrorResponse}},
    dependencies=[Admin],
)
async def spend(
    context_id: ContextIdPath,
    svc: Svc,
    recent: Annotated[
        int, Query(ge=0, le=MAX_SPEND_ROWS, description="Newest spend rows to return.")
    ] = DEFAULT_SPEND_ROWS,
) -> SpendReport:
    """Who spent a context's budget: totals by key and the newest spend rows."""
    ctx = await load_context(context_id, svc, ADMIN)
    totals, rows = await svc.repo.run(lambda conn: spend_of(conn, ctx.id, recent))
    return SpendReport.of(ctx, cost_of(ctx), totals, rows)


@router.delete(
    "/{context_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={404: {"model": ErrorResponse}},
    dependencies=[Admin],
)
async def delete(context_id: ContextIdPath, svc: Svc) -> Response:
    """Delete a context and its ledger."""
    if not is_context_id(context_id) or not await svc.repo.delete(context_id):
        raise NotFound(f"no context with id {context_id[:80]!r}", param="context_id")
    forget_context(context_id)  # its budget series end with it (dpicl.metrics)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
