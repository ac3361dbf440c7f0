"""The server under audit, over HTTP.

=====================  ===========================================================
module                 what it holds
=====================  ===========================================================
:mod:`.target`         the protocols the pipeline needs (:class:`~.target.AuditTarget`,
                       :class:`~.target.GenerationTarget`) and a context's body
:mod:`.http`           dpicl's own client (retries, concurrency, error shapes)
:mod:`.openai`         the audit's queries through an OpenAI-compatible surface
:mod:`.context_hook`   a user's hook that stands up a context on such a deployment
=====================  ===========================================================

The names most modules need are re-exported here (``from dpicl_audit.client import
AuditTarget``); the modules of this package import :mod:`.target` and :mod:`.http` directly.
"""

from __future__ import annotations

from dpicl_audit.client.http import DpiclClient, error_from_response
from dpicl_audit.client.target import AuditTarget, ContextBody, GenerationTarget

__all__ = [
    "AuditTarget",
    "ContextBody",
    "DpiclClient",
    "GenerationTarget",
    "error_from_response",
]
