"""Reading one answer of any route whole (the surface probe's and the parameter sweep's
reader): the request each route takes, the released answer, every field besides it, the public
cost figures and the tokens it reports or streams (probes.surface explains what is tested).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping

import httpx
from pydantic import JsonValue

from dpicl_audit.estimators.extra_fields import response_fields
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.probes.sections import Answer

__all__ = [
    "COST_HEADERS",
    "TRANSPORT",
    "USAGE_COST",
    "read_answer",
    "request",
    "stream_started",
    "usage_name",
]

#: Headers of the transport itself, not of the answer (ids are random: never a category).
TRANSPORT = frozenset(
    {"content-length", "content-type", "content-encoding", "transfer-encoding", "connection"}
    | {"date", "server", "cache-control", "x-accel-buffering", "x-request-id", "vary"}
)
#: The public cost headers and the body field each must equal (path in the body's cost
#: extension: ``cost`` and ``budget`` natively, ``dpicl.cost``/``dpicl.budget`` otherwise).
COST_HEADERS = {
    "x-dpicl-epsilon-spent": ("cost", "epsilon"),
    "x-dpicl-delta-spent": ("cost", "delta"),
    "x-dpicl-context-epsilon-spent": ("budget", "spent_epsilon"),
    "x-dpicl-delta": ("budget", "delta"),
    "x-dpicl-epsilon-remaining": ("budget", "remaining_epsilon"),
    "x-dpicl-queries-remaining": ("budget", "remaining_queries"),
}

#: Where the OpenAI routes repeat the cost headers' figures inside ``usage`` (issue 39), each
#: named as its header: ``usage.dpicl.epsilon_spent`` is ``X-DPICL-Epsilon-Spent``.
USAGE_COST = "usage.dpicl."


def usage_name(header: str) -> str:
    """The ``usage.dpicl`` field of a cost header (:data:`COST_HEADERS`)."""
    return USAGE_COST + header.removeprefix("x-dpicl-").replace("-", "_")


def request(
    route: str, task: str, cid: str, query: str, max_tokens: int | None
) -> tuple[str, JsonObject]:
    if route == "native":
        path = "/v1/classify" if task == "classification" else "/v1/generate"
        body: JsonObject = {"context_id": cid, "query": query}
    elif route.startswith("completions"):
        path, body = "/v1/completions", {"model": cid, "prompt": query}
    else:
        path = "/v1/chat/completions"
        body = {"model": cid, "messages": [{"role": "user", "content": query}]}
    if route.endswith("-stream"):
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return path, body


def _events(text: str) -> list[JsonMapping]:
    out: list[JsonMapping] = []
    for line in text.splitlines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        with contextlib.suppress(ValueError):
            event = json.loads(line[5:])
            if isinstance(event, dict):
                out.append(event)
    return out


def _choices(event: JsonMapping) -> list[JsonMapping]:
    """An event's ``choices`` objects (none where it has no list of them)."""
    found = event.get("choices")
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def _choice_text(choice: JsonMapping) -> str:
    for key in ("delta", "message"):
        part = choice.get(key)
        if isinstance(part, Mapping) and isinstance(part.get("content"), str):
            return str(part["content"])
    return str(choice.get("text") or "")


def stream_started(text: str) -> bool:
    """Whether a stream read so far (server-sent events) has carried a token: an event whose
    choice has text (the role-only first chunk a server may send before it answers is not
    one). The surface probe's time to first token ends here."""
    return any(_choice_text(c) for e in _events(text) for c in _choices(e))


def _without_text(chunk: JsonMapping) -> JsonObject:
    """A chunk's fields besides its text (and what is public by design)."""
    fields = response_fields(chunk)
    return {k: v for k, v in fields.items() if not k.endswith((".delta.content", ".text"))}


def read_answer(route: str, response: httpx.Response) -> Answer:
    """One answer read whole: ``answer`` (the label or text), ``fields`` (what is tested for
    dependence), ``public`` (the body's cost and budget and the cost headers) and ``tokens``
    (the tokens it reports or streams; None where it reports none). ``public`` holds the
    cost headers, the body's ``cost.*``/``budget.*`` and ``usage.dpicl.*``."""
    headers = {k.lower(): v for k, v in response.headers.items()}
    fields: dict[str, JsonValue] = {
        f"header {k}": _number(v)
        for k, v in headers.items()
        if k not in TRANSPORT and k not in COST_HEADERS
    }
    public: dict[str, JsonValue] = {k: headers[k] for k in COST_HEADERS if k in headers}
    counted: list[int] = []
    usage: JsonMapping | None = None
    if route.endswith("-stream"):
        events = _events(response.text)
        if any(isinstance(e.get("error"), Mapping) for e in events):
            raise ValueError("the stream carried an error event")
        texts = [_choice_text(c) for e in events for c in _choices(e)]
        answer = "".join(texts)
        counted.append(sum(1 for t in texts if t))
        fields["stream chunks"] = len(events)
        closing = next((e for e in reversed(events) if e.get("dpicl") is not None), None)
        usage = next((e for e in events if e.get("usage") is not None), None)
        seen: dict[str, set[str]] = {}
        for e in events:
            if e is closing or e is usage:
                continue
            for k, v in _without_text(e).items():
                seen.setdefault(k, set()).add(repr(v))
        fields |= {f"stream chunk {k}": "|".join(sorted(v)) for k, v in seen.items()}
        for name, chunk in (("closing", closing), ("usage", usage)):
            if chunk is not None:
                fields |= {f"stream {name} {k}": v for k, v in _without_text(chunk).items()}
        body = closing or {}
    else:
        body = response.json()
        if not isinstance(body, dict):
            raise ValueError("the answer is not a JSON object")
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            answer = _choice_text(choices[0])
        else:
            answer = str(body.get("label", body.get("text", "")))
        fields |= response_fields(body)
    found = body.get("dpicl")
    ext: JsonMapping = found if isinstance(found, Mapping) else body
    for part in ("cost", "budget"):
        figures = ext.get(part)
        if isinstance(figures, Mapping):
            public |= {f"{part}.{k}": v for k, v in figures.items()}
    usage_of = (usage or {}).get("usage") if route.endswith("-stream") else body.get("usage")
    if isinstance(usage_of, Mapping):
        tokens, cost = usage_of.get("completion_tokens"), usage_of.get("dpicl")
        if isinstance(tokens, int):
            counted.append(int(tokens))
        if isinstance(cost, Mapping):
            public |= {f"{USAGE_COST}{k}": v for k, v in cost.items()}
    return {
        "answer": answer,
        "fields": {
            k: v for k, v in fields.items() if v is None or isinstance(v, str | int | float | bool)
        },
        "public": public,
        "tokens": max(counted) if counted else None,
    }


def _number(value: str) -> float | str:
    """A header's value as a number where it reads as one (tested as a number then)."""
    try:
        found = float(value)
    except ValueError:
        return value
    return found if math.isfinite(found) else value
