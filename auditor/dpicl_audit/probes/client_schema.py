"""Every parameter a client may send to an answering route, and a meaningful value for each
(issue 44, item 4): what the parameter sweep (:mod:`.parameters`) varies.

* **The OpenAI routes** (``chat``: ``/v1/chat/completions``; ``completions``:
  ``/v1/completions``): the request fields of the official ``openai`` SDK's types
  (``openai.types.chat.completion_create_params`` and ``openai.types.completion_create_params``),
  kept in ``dpicl_audit/data/openai_parameters.json`` so that the auditor does not depend on
  the SDK. ``python -m dpicl_audit.probes.client_schema`` rewrites that file from the installed
  SDK, and a test fails when the two drift (``tests/auditor/test_client_schema.py``), as
  ``openapi/openapi.json`` is kept. Besides them, whatever the server's own ``/openapi.json``
  declares for the route.
* **The native routes** (``/v1/classify``): the request body's properties in the server's
  ``/openapi.json``, fetched from outside.

Each parameter is sent with the values of :data:`VALUES` (one or two a parameter, chosen to
ask for something the default does not: a fixed seed, a bias, a penalty at its bound);
a parameter a newer SDK adds has none until one is chosen there (the test says which), and
one the server alone declares gets :func:`example` of its schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from dpicl_audit.errors import TargetError

__all__ = [
    "OWN_FIELDS",
    "ROUTE_PATHS",
    "SNAPSHOT",
    "VALUES",
    "declared",
    "example",
    "fetch_openapi",
    "from_sdk",
    "resolve",
    "sdk_parameters",
    "values_for",
]

#: The routes swept with every parameter, and their paths.
ROUTE_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "native": "/v1/classify",
}
#: Fields every request of the route already sends (or the stream variants vary): not swept.
OWN_FIELDS = {
    "chat": frozenset({"model", "messages", "stream", "stream_options"}),
    "completions": frozenset({"model", "prompt", "stream", "stream_options"}),
    "native": frozenset({"context_id", "query"}),
}
_FUNCTION: dict[str, JsonValue] = {"name": "lookup", "parameters": {"type": "object"}}
_TOOL: dict[str, JsonValue] = {"type": "function", "function": _FUNCTION}
#: Values that ask for something the default does not (OpenAI's API reference for each).
#: Two values where a leak may hang on the value (a seed: the same answers per value; a
#: penalty: either sign); a value is sent on every route that has the parameter, so that one
#: value's answers pool across routes.
VALUES: dict[str, tuple[JsonValue, ...]] = {
    "audio": ({"voice": "alloy", "format": "wav"},),
    "best_of": (2,),
    "echo": (True,),
    "frequency_penalty": (2, -2),
    "function_call": ("auto",),
    "functions": ([_FUNCTION],),
    "logit_bias": ({"1": 100},),
    "logprobs": (True,),
    "max_completion_tokens": (1,),
    "max_tokens": (1,),
    "metadata": ({"purpose": "audit"},),
    "modalities": (["text", "audio"],),
    "moderation": ({"model": "omni-moderation-latest"},),
    "n": (2,),
    "parallel_tool_calls": (False,),
    "prediction": ({"type": "content", "content": "Yes"},),
    "presence_penalty": (2, -2),
    "prompt_cache_key": ("dpicl-audit",),
    "prompt_cache_options": ({"mode": "explicit", "ttl": "30m"},),
    "prompt_cache_retention": ("24h",),
    "reasoning_effort": ("high",),
    "response_format": ({"type": "json_object"},),
    "safety_identifier": ("dpicl-audit",),
    "seed": (7, 8),
    "service_tier": ("priority",),
    "stop": (["\n"],),
    "store": (True,),
    "suffix": (" end",),
    "temperature": (0,),
    "tool_choice": ("required",),
    "tools": ([_TOOL],),
    "top_logprobs": (5,),
    "top_p": (0.1,),
    "user": ("dpicl-audit",),
    "verbosity": ("high",),
    "web_search_options": ({"search_context_size": "high"},),
}
#: Where a route types a parameter otherwise (``logprobs``: a count on completions).
_ROUTE_VALUES: dict[tuple[str, str], tuple[JsonValue, ...]] = {("completions", "logprobs"): (5,)}

#: The SDK's parameters as last taken (beside the bundled datasets, dpicl_audit.datasets).
SNAPSHOT = Path(__file__).resolve().parent.parent / "data" / "openai_parameters.json"


def sdk_parameters() -> dict[str, list[str]]:
    """The OpenAI routes' parameters as last taken from the SDK (the data file)."""
    found = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    return {route: list(found[route]) for route in ("chat", "completions")}


def from_sdk() -> dict[str, Any]:
    """The data file's content from the installed ``openai`` SDK (a development dependency:
    only this function and its test import it)."""
    import typing

    import openai
    from openai.types import completion_create_params as text
    from openai.types.chat import completion_create_params as chat

    def names(cls: type) -> list[str]:
        return sorted(typing.get_type_hints(cls))

    return {
        "source": f"openai {openai.__version__}: CompletionCreateParamsBase of "
        "openai.types.chat.completion_create_params and openai.types.completion_create_params",
        "chat": names(chat.CompletionCreateParamsBase),
        "completions": names(text.CompletionCreateParamsBase),
    }


def declared(openapi: Mapping[str, Any] | None, path: str) -> dict[str, Mapping[str, Any]]:
    """The request body's properties of ``POST path`` in an OpenAPI document, each with its
    schema (``$ref`` resolved); empty where the document does not say."""
    if not isinstance(openapi, Mapping):
        return {}
    try:
        op = openapi["paths"][path]["post"]
        schema = resolve(openapi, op["requestBody"]["content"]["application/json"]["schema"])
    except (KeyError, TypeError):
        return {}
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping):
        return {}
    return {str(k): resolve(openapi, v) for k, v in props.items() if isinstance(v, Mapping)}


def values_for(route: str, name: str, schema: Mapping[str, Any] | None) -> tuple[JsonValue, ...]:
    """The values ``name`` is swept with on ``route``: :data:`VALUES`, else one example of the
    server's schema for it (None: a name only the SDK knows and :data:`VALUES` lacks: a
    string, which a server that does not know it refuses)."""
    if (route, name) in _ROUTE_VALUES:
        return _ROUTE_VALUES[route, name]
    if name in VALUES:
        return VALUES[name]
    return (example(schema or {"type": "string"}),)


def example(schema: Mapping[str, Any], depth: int = 0) -> JsonValue:
    """One value a JSON schema admits, unlike its default where it can be (an enum's other
    member, a boolean's other value, a number at its upper bound): a switch nobody asks for
    by default."""
    if depth > 4:
        return None
    default = schema.get("default")
    if "const" in schema:
        return schema["const"]  # type: ignore[no-any-return]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        others = [v for v in schema["enum"] if v is not None and v != default]
        return others[-1] if others else schema["enum"][0]  # type: ignore[no-any-return]
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key) or [] if o.get("type") != "null"]
        if options:
            return example(options[0], depth + 1)
    kind = schema.get("type")
    if kind == "boolean":
        return not bool(default)
    if kind in ("integer", "number"):
        top = schema.get("maximum", schema.get("minimum", 2))
        return int(top) if kind == "integer" else float(top)
    if kind == "array":
        return [example(schema.get("items") or {"type": "string"}, depth + 1)]
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: example(props[k], depth + 1) for k in schema.get("required", []) if k in props}
    return "dpicl-audit"[: int(schema.get("maxLength", 11))]


async def fetch_openapi(target: Any) -> Mapping[str, Any] | None:
    """The server's ``/openapi.json``, fetched from outside (a raw client's ``send``); None
    where it has none or the client sends no raw requests."""
    if not hasattr(target, "send"):
        return None
    try:
        got = await target.send("/openapi.json", None)
        doc = got.json() if got.status_code == 200 else None
    except (TargetError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def resolve(doc: Mapping[str, Any], schema: Any) -> Any:
    """``schema`` with a ``#/...`` reference followed (one level, then its own)."""
    for _ in range(8):
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, Mapping) else None
        schema = node if isinstance(node, Mapping) else {}
    return schema


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(from_sdk(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
