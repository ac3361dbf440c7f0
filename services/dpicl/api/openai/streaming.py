"""Streamed completions of the OpenAI-compatible routes (``stream: true``), as server-sent
events in OpenAI's chunk format ending with ``data: [DONE]``.

DPS-MOZO streams its tokens as they are sampled (the pipeline's
:class:`~dpicl.mechanisms.base.TokenSink`); voting and ESA (and public contexts) send their
one answer as one chunk. The response starts once the answer is charged, so a refusal
(budget, bad value, unknown model) is still an HTTP error and the headers carry the charge.
A client that disconnects cancels the generation: no further token is sampled, and the
charge, made for the whole answer before the first token, stands (docs/privacy.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi.responses import StreamingResponse

from dpicl.api.openai.errors import openai_status
from dpicl.api.openai.protocol import Kind, OpenAIRequest, Query
from dpicl.api.openai.serving import (
    Answer,
    answer,
    completion_id,
    cost_headers,
    extension,
    usage_of,
)
from dpicl.errors import DpiclError
from dpicl.metrics import note_refusal
from dpicl.privacy.ledger import BudgetStatus, Cost
from dpicl.store.keys import Principal
from dpicl.web.deps import Services


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class _Chunks:
    """The chunks of one streamed completion (OpenAI's chunk objects)."""

    def __init__(self, kind: Kind, model: str, include_usage: bool) -> None:
        self.kind = kind
        self.model = model
        self.id = completion_id(kind)
        self.created = int(time.time())
        self.include_usage = include_usage

    def chunk(
        self, text: str | None, finish: str | None = None, *, first: bool = False
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def closing(self, a: Answer, engine: str, *, text: str | None = None) -> Iterator[str]:
        """The chunk with the finish reason and dpicl's extension, usage, ``[DONE]``."""
        last = self.chunk(text, a.finish_reason, first=text is not None)
        last["dpicl"] = extension(a, engine).model_dump(mode="json")
        yield _sse(last)
        if self.include_usage:
            usage = self.chunk(None) | {"choices": [], "usage": usage_of(a).model_dump()}
            yield _sse(usage)
        yield _sse("[DONE]")


class _QueueSink:
    """A :class:`~dpicl.mechanisms.base.TokenSink` (DPS-MOZO streams to it), into a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def charged(self, cost: Cost, budget: BudgetStatus) -> None:
        self.queue.put_nowait(("charged", (cost, budget)))

    async def text(self, delta: str) -> None:
        self.queue.put_nowait(("text", delta))


def _error_event(exc: DpiclError) -> str:
    note_refusal(exc.code)  # counted in dpicl_refusals_total with the stream's status
    status = openai_status(exc.status_code, exc.code)
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return _sse(
        {"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}}
    )


def _retrieve(task: asyncio.Task[Any]) -> None:
    # A task nobody awaits (its client left) must still have its outcome read.
    if not task.cancelled():
        task.exception()


async def stream_answer(
    req: OpenAIRequest, query: Query, svc: Services, principal: Principal
) -> StreamingResponse:
    """The answer as server-sent events; errors before the charge are plain HTTP errors."""
    kind = req.kind
    sink = _QueueSink()
    task = asyncio.create_task(answer(req, query, svc, principal=principal, sink=sink))
    task.add_done_callback(lambda _: sink.queue.put_nowait(("done", None)))
    task.add_done_callback(_retrieve)
    try:
        event, value = await sink.queue.get()
    except BaseException:
        task.cancel()
        raise
    if event == "done":
        a = task.result()  # raises the refusal (budget, bad value) as an HTTP error
        headers = cost_headers(a.cost, a.budget)
        body = _single(kind, req, a, svc.engine.name)
    else:
        cost, budget = value
        headers = cost_headers(cost, budget)
        body = _tokens(kind, req, sink, task, svc.engine.name)
    headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


def _include_usage(req: OpenAIRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


async def _single(kind: Kind, req: OpenAIRequest, a: Answer, engine: str) -> AsyncIterator[str]:
    chunks = _Chunks(kind, req.model, _include_usage(req))
    for line in chunks.closing(a, engine, text=a.text):
        yield line


async def _tokens(
    kind: Kind, req: OpenAIRequest, sink: _QueueSink, task: asyncio.Task[Answer], engine: str
) -> AsyncIterator[str]:
    chunks = _Chunks(kind, req.model, _include_usage(req))
    try:
        yield _sse(chunks.chunk("" if kind == "chat" else None, first=True))
        while True:
            event, value = await sink.queue.get()
            if event == "done":
                break
            yield _sse(chunks.chunk(str(value)))
        try:
            a = task.result()
        except DpiclError as exc:
            yield _error_event(exc)
            yield _sse("[DONE]")
            return
        for line in chunks.closing(a, engine):
            yield line
    finally:
        # The client left (the stream was cancelled): stop sampling. The charge stands.
        task.cancel()
