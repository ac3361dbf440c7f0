"""Stop an answer nobody waits for: a non-streamed answer is cancelled when its client
disconnects, as a streamed one is (issue 39: a native DPS-MOZO answer of 256 tokens kept half
a core busy for 19 s after its client left).

A request is not cancelled by a disconnect (Starlette runs the route to its end), so the
route runs its answer beside a watcher of the connection: the body is read already, so the
next message the server's ``receive`` gives is ``http.disconnect``, which arrives when the
client leaves (or once the response is complete, by which time the watcher is gone). The
answer's task is then cancelled: the mechanism stops between engine calls (DPS-MOZO between
tokens), its engine call is abandoned, and the charge stands, as the documented rule for a
cancelled answer says (docs/privacy.md, "Stopped and streamed answers"). The request is
answered 499 (nginx's "client closed request") for the access log: nobody reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from dpicl.errors import DpiclError

__all__ = ["CLIENT_CLOSED_REQUEST", "ClientClosedRequest", "unless_disconnected"]

T = TypeVar("T")

#: nginx's "client closed request": what an answer stopped by a disconnect is logged with.
CLIENT_CLOSED_REQUEST = 499


class ClientClosedRequest(DpiclError):
    """The client left before its answer was ready: the answer was stopped, not sent."""

    status_code = CLIENT_CLOSED_REQUEST
    code = "client_closed_request"


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass  # a body's late chunk (none after a parsed body): keep listening


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled and
    :class:`ClientClosedRequest` raised (see the module docstring)."""
    answer = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((answer, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request was cancelled itself (the server stops)
        answer.cancel()
        watcher.cancel()
        raise
    if answer.done():
        watcher.cancel()
        return answer.result()
    answer.cancel()
    # Wait for the cancellation to reach the engine call (the work stops here, not later);
    # whatever the cancelled answer raised, nobody is left to read it.
    with contextlib.suppress(BaseException):
        await answer
    raise ClientClosedRequest("the client closed the connection before its answer was ready")
