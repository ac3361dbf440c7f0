"""The audit's queries through an OpenAI-compatible surface (``dpicl-audit run --api openai``).

:class:`OpenAIClient` is the :class:`~dpicl_audit.client.http.DpiclClient` (same transport,
concurrency, retries and error handling) with the queries sent as chat completions: the
audit query is the one user message, ``model`` is the context, and the released label or
text is read from ``choices[0].message.content``. dpicl's cost extension (``dpicl``), when
the server sends one, is kept as the native routes' ``cost`` and ``budget``.

The neighbouring contexts are created as for the native routes (``POST /v1/contexts`` with
the admin token), or by a context hook (:mod:`dpicl_audit.client.context_hook`) for a deployment
that is not dpicl: the hook creates each context and names its model; the client then
checks a recorded model still exists with ``GET /v1/models/{id}``, adopts nothing by name and
deletes nothing (the deployment is its operator's).

Only black-box audits go through this surface: it has no debug endpoints (a white-box or
bootstrap audit stops with a :class:`~dpicl_audit.errors.TargetProtocolError` saying so).
"""

from __future__ import annotations

from typing import Any

from dpicl_audit.client.context_hook import ContextHook
from dpicl_audit.client.http import DpiclClient
from dpicl_audit.client.target import ContextBody
from dpicl_audit.context_info import ContextInfo, context_info
from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.jsontypes import JsonObject

__all__ = ["OpenAIClient"]

CHAT_PATH = "/v1/chat/completions"


class OpenAIClient(DpiclClient):
    """A :class:`DpiclClient` whose queries are OpenAI chat completions.

    ``base_url`` is the part before ``/v1`` (an OpenAI client's ``base_url`` minus ``/v1``).
    ``hook``: creates the contexts instead of ``POST /v1/contexts``.
    """

    def __init__(self, base_url: str, *, hook: ContextHook | None = None, **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self._hook = hook

    # --------------------------------------------------------------- contexts

    async def create_context(self, body: ContextBody) -> ContextInfo:
        if self._hook is None:
            return await super().create_context(body)
        return context_info(await self._hook(body))

    async def get_context(self, context_id: str) -> ContextInfo:
        if self._hook is None:
            return await super().get_context(context_id)
        model = await self._json("GET", f"/v1/models/{context_id}", token=self._key)
        # dpicl's extension carries the ledger as the native route reports it ("spent").
        ext = model.get("dpicl") if isinstance(model, dict) else None
        spent = ext.get("spent") if isinstance(ext, dict) else None
        found: JsonObject = {"id": context_id, "model": model}
        return context_info(found | ({"spent": spent} if spent else {}))

    async def list_contexts(self) -> list[JsonObject]:
        if self._hook is None:
            return await super().list_contexts()
        return []  # a hook's models carry no audit names to adopt

    async def delete_context(self, context_id: str) -> None:
        if self._hook is None:
            await super().delete_context(context_id)

    # --------------------------------------------------------------- queries

    async def _chat(
        self, context_id: str, query: str, max_tokens: int | None
    ) -> tuple[str, JsonObject]:
        body: JsonObject = {"model": context_id, "messages": [{"role": "user", "content": query}]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        out = await self._json("POST", CHAT_PATH, token=self._key, json=body)
        choices = out.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        if not isinstance(message, dict) or "content" not in message:
            raise TargetProtocolError(
                f"POST {CHAT_PATH} answered without choices[0].message.content"
            )
        content = message["content"]
        if not isinstance(content, str):
            raise TargetProtocolError(f"POST {CHAT_PATH} answered a non-text message content")
        ext = out.get("dpicl")
        extra: JsonObject = (
            {k: ext[k] for k in ("cost", "budget", "engine") if k in ext}
            if isinstance(ext, dict)
            else {}
        )
        # The whole response too: every field besides the answer is an observation
        # (dpicl_audit.estimators.extra_fields).
        return content, extra | {"context_id": context_id, "response": out}

    async def classify(self, context_id: str, query: str) -> JsonObject:
        label, extra = await self._chat(context_id, query, None)
        return {"label": label} | extra

    async def generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JsonObject:
        text, extra = await self._chat(context_id, query, max_tokens)
        return {"text": text} | extra

    async def debug_classify(self, context_id: str, query: str) -> JsonObject:
        raise _no_whitebox()

    async def debug_generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JsonObject:
        raise _no_whitebox()


def _no_whitebox() -> TargetProtocolError:
    return TargetProtocolError(
        "the OpenAI-compatible surface releases only the answer: white-box and bootstrap "
        "audits need dpicl's debug endpoints (run them with --api native)"
    )
