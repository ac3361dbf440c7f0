"""A deadline on reading a request's body: ``408 request_timeout`` for a body that does not
arrive in time.

Without it a client announcing a 4 MiB body and trickling a byte now and then held a
connection and a request (and the memory of its body so far) forever. The deadline covers the
whole body, from the app's first read: a client that sends a byte per second keeps no body
alive past it. uvicorn bounds the head (``dpicl.api.http_limits``); this bounds the body.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpicl.errors import RequestTimeout


class BodyTimeoutMiddleware:
    """Refuse a body not read in full within ``timeout_s`` seconds of the app's first read.

    The refusal is raised from ``receive`` as ``RequestTimeout``, so it reaches the error
    handlers as BodyLimitMiddleware's 413 does, and its response closes the connection: the
    rest of the body would otherwise be parsed as the next request.
    """

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline: float | None = None
        body_done = False
        timed_out = False

        async def timed_receive() -> Message:
            nonlocal deadline, body_done, timed_out
            if body_done:
                return await receive()  # e.g. waiting for a disconnect: no deadline
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.timeout_s
            try:
                # timeout_at, not wait_for: no task per read on the request path.
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                timed_out = True
                raise RequestTimeout(
                    f"the request body did not arrive within {self.timeout_s} s "
                    "(DPICL_BODY_TIMEOUT_S)"
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def closing_send(message: Message) -> None:
            if timed_out and message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, timed_receive, closing_send)
