"""API keys as records: created (the secret shown once), listed, revoked. Admin only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from dpicl.api.spend_schemas import KeyCreated, KeyInfo, KeyList, KeySpec
from dpicl.errors import ConfigurationError, InvalidRequest, NotFound
from dpicl.privacy.accounting import budget_mu2
from dpicl.store.keys import (
    KEY_ID_PATTERN,
    insert_key,
    is_key_id,
    list_keys,
    new_key_id,
    new_secret,
    revoke_key,
    secret_hash,
)
from dpicl.web.deps import Admin, KeyIdPath, Svc, cursor_query, only_query_params
from dpicl.web.schemas import ErrorResponse

router = APIRouter(
    prefix="/v1/keys",
    tags=["keys"],
    dependencies=[Admin],
    responses={401: {"model": ErrorResponse}},
)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KeyCreated)
async def create_key(spec: KeySpec, svc: Svc) -> KeyCreated:
    """Create a key scoped to a tenant or to contexts; its secret is shown in this answer only."""
    if (spec.tenant is None) == (spec.contexts is None):
        raise ConfigurationError(
            "give exactly one scope: tenant (every context of that tenant) or contexts "
            "(a list of context ids)",
            param="tenant" if spec.tenant is not None else "contexts",
        )
    mu2_max: float | None = None
    if spec.budget is not None:
        most = svc.settings.max_budget_epsilon
        if spec.budget.epsilon > most:
            raise ConfigurationError(
                f"budget.epsilon={spec.budget.epsilon!r} exceeds this server's limit of "
                f"{most!r} (DPICL_MAX_BUDGET_EPSILON)",
                param="budget.epsilon",
            )
        mu2_max = budget_mu2(spec.budget.epsilon, spec.budget.delta)
    secret = new_secret()
    values: dict[str, Any] = {
        "id": new_key_id(),
        "name": spec.name,
        "secret_hash": secret_hash(secret),
        "tenant": spec.tenant,
        "contexts": sorted(set(spec.contexts)) if spec.contexts is not None else None,
        "budget": spec.budget.model_dump() if spec.budget is not None else None,
        "mu2_spent": 0.0,
        "mu2_max": mu2_max,
        "queries": 0,
        "rate_limit": spec.rate_limit,
        "rate_window": None,
        "rate_count": 0,
        "created_at": datetime.now(UTC),
        "revoked_at": None,
    }
    key = await svc.repo.run(lambda conn: insert_key(conn, values), write=True)
    return KeyCreated(**KeyInfo.of(key).model_dump(), secret=secret)


#: Keys per page when `limit` is not given, and at most.
DEFAULT_KEY_LIMIT = 100
MAX_KEY_LIMIT = 1000


@router.get(
    "", response_model=KeyList, dependencies=[only_query_params("revoked", "limit", "after")]
)
async def get_keys(
    svc: Svc,
    revoked: Annotated[bool, Query(description="Include revoked keys.")] = False,
    limit: Annotated[
        int, Query(ge=1, le=MAX_KEY_LIMIT, description="Keys per page.")
    ] = DEFAULT_KEY_LIMIT,
    after: Annotated[
        str | None,
        cursor_query(
            "The `next` of the previous page; omit for the first.", pattern=KEY_ID_PATTERN
        ),
    ] = None,
) -> KeyList:
    """List keys in id order, a page at a time, with what each spent (never a secret)."""
    if after is not None and not is_key_id(after):
        raise InvalidRequest(
            f"after={after[:80]!r} is not a key id (key_ and 24 hex digits): pass the `next` "
            "of the previous page",
            param="after",
        )
    keys, last = await svc.repo.run(
        lambda conn: list_keys(conn, include_revoked=revoked, limit=limit, after=after)
    )
    return KeyList(data=[KeyInfo.of(k) for k in keys], next=last)


@router.delete(
    "/{key_id}", status_code=status.HTTP_204_NO_CONTENT, responses={404: {"model": ErrorResponse}}
)
async def delete_key(key_id: KeyIdPath, svc: Svc) -> Response:
    """Revoke a key: every server process refuses it from now on."""
    # An id no key can have is not looked up (nor sent to the database).
    if not is_key_id(key_id) or not await svc.repo.run(
        lambda conn: revoke_key(conn, key_id), write=True
    ):
        raise NotFound(f"no live key with id {key_id[:80]!r}", param="key_id")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
