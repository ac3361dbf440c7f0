"""Listing contexts a page at a time, whatever surface asked (``GET /v1/contexts`` with its
cursors, ``GET /v1/models`` with OpenAI's ``after``): the contexts a key reaches, oldest
first."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from dpicl.errors import InvalidRequest
from dpicl.store.keys import Principal
from dpicl.store.repository import ContextKey, ListedContext
from dpicl.web.deps import Services

#: A cursor: the created_at (microseconds since the epoch, UTC) and the id of a page's last
#: context. Its form is all there is to check: any cursor of this form names a place in the
#: listing's order, so the published schema (this pattern) says exactly which are accepted
#: (issue 39; it was base64, whose content no schema can describe).
CURSOR_PATTERN = r"^[0-9]{1,16}_ctx_[0-9a-f]{24}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def encode_cursor(key: ContextKey) -> str:
    """The cursor of the (created_at, id) of a page's last context (:data:`CURSOR_PATTERN`)."""
    at, cid = key
    return f"{(at - _EPOCH) // _MICROSECOND}_{cid}"


def decode_cursor(cursor: str) -> ContextKey:
    """The key a cursor from :func:`encode_cursor` holds, or a 422 naming it."""
    if re.fullmatch(CURSOR_PATTERN, cursor) is None:
        raise InvalidRequest(
            f"cursor {cursor[:80]!r} is not one this server issued: pass the `next` of "
            "the previous page",
            param="cursor",
        )
    micros, cid = cursor.split("_", 1)
    return _EPOCH + int(micros) * _MICROSECOND, cid


async def list_reachable(
    svc: Services, principal: Principal, limit: int, after: ContextKey | None
) -> tuple[list[ListedContext], ContextKey | None]:
    """One page of the contexts ``principal`` reaches: what ``GET /v1/contexts`` lists (the
    admin and static keys: all; a database key: its own contexts or its tenant's)."""
    return await svc.repo.list_page(limit, after, principal=principal)
