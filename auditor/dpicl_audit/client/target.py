"""What the pipeline needs from a server under audit: the :class:`AuditTarget` protocol
(and :class:`GenerationTarget` for a generation audit), and the body of a context as an
audit builds it (:class:`ContextBody`). :class:`~dpicl_audit.client.http.DpiclClient` is
dpicl's own implementation; tests hand the runner any other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Required, TypedDict, runtime_checkable

from dpicl_audit.context_info import ContextInfo
from dpicl_audit.jsontypes import JsonMapping, JsonObject

__all__ = ["AuditTarget", "ContextBody", "GenerationTarget"]


class ContextBody(TypedDict, total=False):
    """The body of ``POST /v1/contexts`` (HTTP API v1) as an audit builds it; ``mechanism``
    holds the settings of the mechanism it names (each mechanism's audit writes its own)."""

    name: Required[str]
    task: Required[str]
    exemplars: Required[list[dict[str, str]]]
    mechanism: Required[JsonObject]
    budget: dict[str, float] | None
    labels: list[str]
    template: str


@runtime_checkable
class AuditTarget(Protocol):
    """What the runner needs from a server under audit."""

    async def health(self) -> JsonMapping: ...

    async def create_context(self, body: ContextBody) -> ContextInfo: ...

    async def get_context(self, context_id: str) -> ContextInfo: ...

    async def list_contexts(self) -> Sequence[JsonMapping]: ...

    async def delete_context(self, context_id: str) -> None: ...

    async def classify(self, context_id: str, query: str) -> JsonMapping: ...

    async def debug_classify(self, context_id: str, query: str) -> JsonMapping: ...


@runtime_checkable
class GenerationTarget(AuditTarget, Protocol):
    """What an ESA (generation) audit needs besides :class:`AuditTarget`."""

    async def generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JsonMapping: ...

    async def debug_generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JsonMapping: ...
