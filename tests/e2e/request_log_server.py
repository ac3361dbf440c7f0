"""Test server (not a fault): the honest app, every request's method and path appended to
the file named by ``DPICL_TEST_REQUEST_LOG`` when it arrives, so that a test sees from
outside which step of an audit a client has reached (the probes from outside send routes
the trials never do), and the OpenAI routes slowed by ``DELAY`` seconds an answer, so that
the probes that use them last long enough to be interrupted on any machine.

    start_server(env | {"DPICL_TEST_REQUEST_LOG": path}, fault="tests.e2e.request_log_server")
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

DELAY = 0.02
SLOWED = ("/v1/chat/completions", "/v1/completions")
WARNING = f"TEST SERVER: requests logged, {', '.join(SLOWED)} slowed by {DELAY} s"
"""What the server logs at start (:func:`tests.servers.serve_with_fault`)."""

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_honest_run = uvicorn.run


def logged_app(app: Any, log: str) -> Any:
    """``app`` with each HTTP request's ``METHOD path`` appended to ``log`` on arrival."""

    async def wrapped(scope: Message, receive: Receive, send: Send) -> None:
        if scope.get("type") == "http":
            with open(log, "a") as f:  # noqa: ASYNC230 (a test server; one short line)
                f.write(f"{scope.get('method')} {scope.get('path')}\n")
            if scope.get("path") in SLOWED:
                await asyncio.sleep(DELAY)
        await app(scope, receive, send)

    return wrapped


def install() -> None:
    """Serve the app wrapped (:func:`tests.servers.serve_with_fault` hands the app it built
    to ``uvicorn.run``)."""
    log = os.environ["DPICL_TEST_REQUEST_LOG"]

    def run(app: Any, **kw: Any) -> None:
        _honest_run(logged_app(app, log), **kw)

    uvicorn.run = run
