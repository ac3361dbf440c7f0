"""The server under audit, over HTTP.

=====================  ===========================================================
module                 what it holds
=====================  ===========================================================
:mod:`.http`           the protocols the pipeline needs (:class:`~.http.AuditTarget`,
                       :class:`~.http.GenerationTarget`) and dpicl's own client
:mod:`.openai`         the audit's queries through an OpenAI-compatible surface
:mod:`.context_hook`   a user's hook that stands up a context on such a deployment
=====================  ===========================================================

The names most modules need are re-exported here (``from dpicl_audit.client import
AuditTarget``); the modules of this package import :mod:`.http` directly.
"""

from __future__ import annotations

from dpicl_audit.client.http import (
    JSON,
    AuditTarget,
    ContextBody,
    DpiclClient,
    GenerationTarget,
    error_from_response,
)

__all__ = [
    "JSON",
    "AuditTarget",
    "ContextBody",
    "DpiclClient",
    "GenerationTarget",
    "error_from_response",
]
