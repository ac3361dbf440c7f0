"""A user-given hook that stands up one neighbouring context on a DP-ICL deployment that is
not dpicl (or is, without handing the auditor its admin token), and names the model to query.

``target.context_hook`` (``--context-hook``) is either

* a Python entry point ``module:function`` (``function(body)``, sync or async), or
* a command (split like a shell would, run without a shell), which reads the body as JSON
  on its standard input and writes its answer on its standard output.

The body is what ``POST /v1/contexts`` would get (docs/auditing.md): ``name``, ``task``,
``labels``, ``template``, ``exemplars`` (``[{"input", "output"}]``, C1's with the canary,
C0's without), ``mechanism`` (``name``, ``epsilon``, ``delta``, ``partitions``,
``partition_seed``, ...) and ``budget``. The answer is the model id to query, either as a
bare string (a command: its last non-empty line) or as a JSON object ``{"id": ..., ...}``
whose other fields describe the context as the deployment runs it; its ``mechanism`` is
merged over the body's. A Gaussian mechanism's audit needs the noise the deployment uses:
return ``{"id": ..., "mechanism": {"sigma": ...}}`` (dpicl's own ``POST /v1/contexts``
answer has it).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dpicl_audit.client.target import ContextBody
from dpicl_audit.errors import InvalidPlan, TargetProtocolError
from dpicl_audit.jsontypes import JsonObject, JsonValue

__all__ = ["ContextHook", "context_info", "load_hook"]

ContextHook = Callable[[ContextBody], Awaitable[JsonObject]]
"""Takes a context body; returns the context's description, with at least its ``id``."""

_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def context_info(body: ContextBody, answer: object, hook: str) -> JsonObject:
    """The context as the audit records it: the body's description, the hook's fields over
    it (its ``mechanism`` merged over the body's), ``id`` the model to query."""
    if isinstance(answer, str):
        answer = {"id": answer}
    if not isinstance(answer, Mapping) or not isinstance(answer.get("id"), str):
        raise TargetProtocolError(
            f"context hook {hook!r} must return a model id or an object with a string 'id'; "
            f"got {str(answer)[:200]!r}"
        )
    model = answer["id"].strip()
    if not model:
        raise TargetProtocolError(f"context hook {hook!r} returned an empty model id")
    labels = body.get("labels")
    info: JsonObject = {
        "name": body.get("name"),
        "task": body.get("task"),
        "labels": None if labels is None else list(labels),
        "template": body.get("template"),
        "n_exemplars": len(body.get("exemplars") or []),
    }
    # The answer is JSON (a command's stdout) or what a Python hook returned: kept as given.
    info |= {k: v for k, v in answer.items() if k != "mechanism"}
    info["mechanism"] = dict(body.get("mechanism") or {}) | dict(answer.get("mechanism") or {})
    info["id"] = model
    return info


def load_hook(spec: str, *, timeout: float) -> ContextHook:
    """The hook ``spec`` names: an entry point ``module:function``, else a command."""
    spec = spec.strip()
    if _ENTRY_POINT.match(spec):
        module, _, name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise InvalidPlan(
                f"context hook {spec!r}: cannot load {name} from {module}: {exc}"
            ) from None
        if not callable(fn):
            raise InvalidPlan(f"context hook {spec!r} is not callable")
        return _python_hook(spec, fn)
    try:
        argv = shlex.split(spec)
    except ValueError as exc:
        raise InvalidPlan(f"context hook {spec!r} is not a command line: {exc}") from None
    return _command_hook(spec, argv, timeout)


def _python_hook(spec: str, fn: Callable[..., Any]) -> ContextHook:
    async def call(body: ContextBody) -> JsonObject:
        if inspect.iscoroutinefunction(fn):
            out = await fn(dict(body))
        else:
            # A plain function may block on its own HTTP calls: off the event loop.
            out = await asyncio.to_thread(fn, dict(body))
        return context_info(body, out, spec)

    return call


def _command_hook(spec: str, argv: list[str], timeout: float) -> ContextHook:
    async def call(body: ContextBody) -> JsonObject:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise TargetProtocolError(f"context hook {spec!r} cannot run: {exc}") from None
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(json.dumps(body).encode()), timeout=timeout
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise TargetProtocolError(
                f"context hook {spec!r} did not answer within {timeout:g} s"
            ) from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-500:]
            raise TargetProtocolError(
                f"context hook {spec!r} exited with status {proc.returncode}: {tail}"
            )
        text = out.decode(errors="replace").strip()
        answer: JsonValue
        try:
            answer = json.loads(text)
        except ValueError:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            answer = lines[-1] if lines else ""
        return context_info(body, answer, spec)

    return call
