"""Undocumented switches that turn on a debug view (issue 44, item 4).

A server may answer more than its documented fields when asked in a way no document names:
a ``?debug=1`` left in from development, an ``X-Debug`` header a gateway honours, a
``whitebox`` flag the public routes read. None of them shows in the trials, which ask plainly.
So, after the trials, a fresh context of the run's C1 body (the first epsilon, budgeted for
the probe) is asked the audit query on every answering route (native, ``/v1/chat/completions``
and ``/v1/completions``, each also streamed; through ``--api openai`` no native route):
:data:`PLAIN` times plainly, then once with each switch of :data:`QUERY_SWITCHES` (a query
string) and of :data:`HEADER_SWITCHES` (a request header) alone.

The route's documented fields are what its plain answers carry and what the server's
``/openapi.json`` declares for its answer (:func:`shape`): the body's keys as dotted paths
(nested keys, list items as ``[]``), the header names (but the transport's own,
:data:`~.answers.TRANSPORT`) and, streamed, every chunk's keys. A switched answer whose key set
has any key beyond those, or whose status class is another (a redirect, a server error
twice), is a VIOLATION naming the switch, the route and the extra keys. A refusal (4xx) is
fine: the switch is not honoured.

Only key sets are compared, never values: an honest server, which ignores what it does not
document, answers a switched request through the code path of a plain one, so the comparison
is deterministic and cannot raise a false alarm by chance (a field a server adds only at
random, say one answer in a hundred, could; dpicl adds none, and its answers' key sets are
those its OpenAPI document declares). The result is ``results["switches"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.errors import TargetError
from dpicl_audit.probes.answers import TRANSPORT, request
from dpicl_audit.probes.client_schema import fetch_openapi, resolve
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.probes.sections import SwitchesSection, SwitchFinding

__all__ = ["HEADER_SWITCHES", "PLAIN", "QUERY_SWITCHES", "ROUTES", "audit_switches", "probe"]

#: Query parameters that commonly switch a debug or internal view on (Django/Flask/Rails
#: debug toolbars, tracing middleware, "explain" modes of search and LLM gateways, and this
#: project's own white-box vocabulary).
QUERY_SWITCHES: tuple[tuple[str, str], ...] = (
    ("debug", "1"),
    ("debug", "true"),
    ("verbose", "1"),
    ("whitebox", "1"),
    ("white_box", "true"),
    ("whitebox", "internal"),
    ("explain", "1"),
    ("trace", "1"),
    ("raw", "1"),
    ("internal", "1"),
    ("include_votes", "true"),
)
#: Request headers that commonly do the same (gateway and proxy debug headers).
HEADER_SWITCHES: tuple[tuple[str, str], ...] = (
    ("X-Debug", "1"),
    ("X-DPICL-Debug", "1"),
    ("X-Whitebox", "1"),
    ("X-DPICL-Whitebox", "internal"),
    ("X-Debug-Mode", "true"),
    ("X-Internal", "1"),
    ("X-Verbose", "1"),
    ("X-Trace", "1"),
)
#: The answering routes, as :mod:`.surface` names them.
ROUTES = ("native", "chat", "completions", "chat-stream", "completions-stream")
#: Plain answers per route that learn its documented fields.
PLAIN = 2


def switch_name(kind: str, name: str, value: str) -> str:
    """How a switch is named in the results: ``?debug=1`` or ``header X-Debug: 1``."""
    return f"?{name}={value}" if kind == "query" else f"header {name}: {value}"


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key of a JSON value as a dotted path, list items as ``[]`` (``choices[].index``)."""
    out: set[str] = set()
    if isinstance(value, Mapping):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= key_paths(v, path)
    elif isinstance(value, list):
        for item in value:
            out |= key_paths(item, f"{prefix}[]")
    return out


def shape(route: str, response: httpx.Response) -> set[str]:
    """A response's keys: ``body <path>``, ``header <name>``, streamed ``chunk <path>``."""
    keys = {f"header {k.lower()}" for k in response.headers if k.lower() not in TRANSPORT}
    if route.endswith("-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                with contextlib.suppress(ValueError):
                    keys |= {f"chunk {p}" for p in key_paths(json.loads(line[5:]))}
        return keys
    with contextlib.suppress(ValueError):
        keys |= {f"body {p}" for p in key_paths(response.json())}
    return keys


def declared_keys(openapi: Mapping[str, Any] | None, path: str) -> tuple[set[str], set[str]]:
    """The body keys the OpenAPI document declares for ``POST path``'s 200 answer, and the
    prefixes under which any key is declared (an object of ``additionalProperties``)."""
    keys: set[str] = set()
    open_: set[str] = set()
    if not isinstance(openapi, Mapping):
        return keys, open_
    try:
        root = openapi["paths"][path]["post"]["responses"]["200"]["content"]
        schema = root["application/json"]["schema"]
    except (KeyError, TypeError):
        return keys, open_

    def walk(node: Any, prefix: str, depth: int) -> None:
        node = resolve(openapi, node)
        if not isinstance(node, Mapping) or depth > 12:
            return
        for key in ("anyOf", "oneOf", "allOf"):
            for option in node.get(key) or []:
                walk(option, prefix, depth + 1)
        if "items" in node:
            walk(node["items"], f"{prefix}[]", depth + 1)
        for k, sub in (node.get("properties") or {}).items():
            path = f"{prefix}.{k}" if prefix else str(k)
            keys.add(f"body {path}")
            walk(sub, path, depth + 1)
        if node.get("additionalProperties") not in (None, False):
            open_.add(f"body {prefix}." if prefix else "body ")

    walk(schema, "", 0)
    return keys, open_


def undocumented(found: set[str], documented: set[str], open_: set[str]) -> list[str]:
    """The keys of ``found`` neither documented nor under an open prefix, sorted."""
    return sorted(k for k in found - documented if not any(k.startswith(p) for p in open_))


async def audit_switches(
    target: AuditTarget, body: ContextBody, query: str, *, task: str, max_tokens: int | None
) -> SwitchesSection | None:
    """The probe of the module docstring on a fresh context of ``body`` (budgeted for
    :func:`answers_needed` answers); None where the client cannot send raw requests."""
    if not hasattr(target, "send"):
        return None
    routes = _routes(target)
    openapi = await fetch_openapi(target)
    info = await target.create_context(body | {"name": f"{body.get('name')} switches"})
    cid = str(info["id"])
    switches = [("query", n, v) for n, v in QUERY_SWITCHES]
    switches += [("header", n, v) for n, v in HEADER_SWITCHES]

    async def ask(route: str, kind: str | None, name: str, value: str) -> httpx.Response | str:
        path, sent = request(route, task, cid, query, max_tokens)
        try:
            for _ in range(2):  # a server error once may be the server's load; twice is not
                got = await target.send(
                    path,
                    sent,
                    params={name: value} if kind == "query" else None,
                    headers={name: value} if kind == "header" else None,
                )
                if got.status_code < 500:
                    break
        except TargetError as exc:
            return f"failed ({exc})"
        return got  # type: ignore[no-any-return]

    try:
        plain = {
            r: await asyncio.gather(*(ask(r, None, "", "") for _ in range(PLAIN))) for r in routes
        }
        asked = [(r, s) for r in routes for s in switches if _answers(plain[r])]
        got = await asyncio.gather(*(ask(r, *s) for r, s in asked))
    finally:
        with contextlib.suppress(TargetError):
            await target.delete_context(cid)
    paths = {r: request(r, task, cid, query, max_tokens)[0] for r in routes}
    return _conclude(paths, plain, dict(zip(asked, got, strict=True)), openapi)


def _answers(plain: list[httpx.Response | str]) -> list[httpx.Response]:
    return [p for p in plain if isinstance(p, httpx.Response) and p.status_code < 300]


def _conclude(
    paths: Mapping[str, str],
    plain: Mapping[str, list[httpx.Response | str]],
    switched: Mapping[tuple[str, tuple[str, str, str]], httpx.Response | str],
    openapi: Mapping[str, Any] | None,
) -> SwitchesSection:
    findings: list[SwitchFinding] = []
    refused: list[str] = []
    checked: list[str] = []
    for route, path in paths.items():
        answered = _answers(plain[route])
        if not answered:
            continue
        checked.append(route)
        # A stream's chunks are not in the document (it declares the JSON answer only).
        documented, open_ = declared_keys(None if route.endswith("-stream") else openapi, path)
        for a in answered:
            documented |= shape(route, a)
        for (r, (kind, name, value)), got in switched.items():
            if r != route:
                continue
            switch = switch_name(kind, name, value)
            if isinstance(got, str):
                refused.append(f"{route} {switch}: {got}")
                continue
            if 400 <= got.status_code < 500:
                refused.append(f"{route} {switch}: {got.status_code}")
                continue
            extra = undocumented(shape(route, got), documented, open_)
            if got.status_code >= 300 or extra:
                findings.append(
                    {
                        "switch": switch,
                        "route": route,
                        "status_code": got.status_code,
                        "extra": extra[:12],
                    }
                )
    return _section(checked, findings, refused)


def _section(
    checked: list[str], findings: list[SwitchFinding], refused: list[str]
) -> SwitchesSection:
    n = len(QUERY_SWITCHES) + len(HEADER_SWITCHES)
    out: SwitchesSection = {
        "status": "ok",
        "message": "",
        "routes": checked,
        "switches": n,
        "findings": findings,
        "refused": refused[:20],
    }
    if not checked:
        out["status"], out["message"] = "unchecked", "no route answered a plain request"
    elif findings:
        first = findings[0]
        said = "; ".join(
            f"{f['switch']} on {f['route']}: "
            + (
                f"status {f['status_code']} where a plain request answers 2xx"
                if f["status_code"] >= 300
                else "undocumented " + ", ".join(f["extra"][:4])
            )
            for f in findings[:4]
        )
        out["status"] = "violation"
        out["message"] = (
            f"VIOLATION: the switch {first['switch']} on the {first['route']} route makes the "
            f"answer carry more than the documented fields ({len(findings)} switched answers "
            f"in all): {said}"
        )
    else:
        out["message"] = (
            f"{n} switches (query parameters and headers) on {len(checked)} routes "
            f"({', '.join(checked)}): no answer carried a key beyond the plain answer's and "
            f"the OpenAPI document's ({len(refused)} refused)"
        )
    return out


def _routes(target: Any) -> tuple[str, ...]:
    return tuple(r for r in ROUTES if not (r == "native" and isinstance(target, OpenAIClient)))


def answers_needed(target: Any) -> int:
    """The answers the probe asks for through ``target``: what its context's budget holds."""
    return len(_routes(target)) * (PLAIN + len(QUERY_SWITCHES) + len(HEADER_SWITCHES))


async def probe(target: AuditTarget, kit: Ingredients) -> SwitchesSection | None:
    """The switches on a fresh context of C1's body at the first epsilon (a generation
    context asked for one token an answer, as :mod:`.surface` asks)."""
    if kit.query is None:
        return None
    eps = kit.epsilons[0]
    body = kit.body(1, eps, f"{kit.name} C1")
    held = kit.hold(body, eps, answers_needed(target)) or body | {"budget": None}
    limit = 1 if kit.token_limit is not None else None
    return await audit_switches(target, held, kit.query, task=kit.task, max_tokens=limit)
