"""What the pipeline needs from a server under audit: the :class:`AuditTarget` protocol
(and :class:`GenerationTarget` for a generation audit), and the body of a context as an
audit builds it (:class:`ContextBody`). :class:`~dpicl_audit.client.http.DpiclClient` is
dpicl's own implementation; tests hand the runner any other."""

from __future__ import annotations

from typing import Any, Protocol, Required, TypedDict, runtime_checkable

__all__ = ["JSON", "AuditTarget", "ContextBody", "GenerationTarget"]

JSON = dict[str, Any]


class ContextBody(TypedDict, total=False):
    """The body of ``POST /v1/contexts`` (HTTP API v1) as an audit builds it; ``mechanism``
    holds the settings of the mechanism it names (each mechanism's audit writes its own)."""

    name: Required[str]
    task: Required[str]
    exemplars: Required[list[dict[str, str]]]
    mechanism: Required[dict[str, object]]
    budget: dict[str, float] | None
    labels: list[str]
    template: str


@runtime_checkable
class AuditTarget(Protocol):
    """What the runner needs from a server under audit."""

    async def health(self) -> JSON: ...

    async def create_context(self, body: ContextBody) -> JSON: ...

    async def get_context(self, context_id: str) -> JSON: ...

    async def list_contexts(self) -> list[JSON]: ...

    async def delete_context(self, context_id: str) -> None: ...

    async def classify(self, context_id: str, query: str) -> JSON: ...

    async def debug_classify(self, context_id: str, query: str) -> JSON: ...


@runtime_checkable
class GenerationTarget(AuditTarget, Protocol):
    """What an ESA (generation) audit needs besides :class:`AuditTarget`."""

    async def generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JSON: ...

    async def debug_generate(
        self, context_id: str, query: str, max_tokens: int | None = None
    ) -> JSON: ...
