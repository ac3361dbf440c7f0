"""What a run opens: the trial log, the HTTP client, the server's health, and the versions
recorded with the run (auditor, Python, packages, the server's ``/healthz``)."""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dpicl_audit import __version__
from dpicl_audit.client import AuditTarget, DpiclClient
from dpicl_audit.errors import InvalidPlan, TargetError, TargetUnavailable
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import TrialStore

__all__ = [
    "client_for",
    "need_context_maker",
    "opened_store",
    "run_versions",
    "server_health",
]


def run_versions(health: Mapping[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    import httpx
    import scipy
    import sqlalchemy

    out: dict[str, Any] = {
        "auditor": __version__,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "packages": {
            "httpx": httpx.__version__,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "sqlalchemy": sqlalchemy.__version__,
        },
        "server": dict(health) if health is not None else {"error": error},
    }
    try:
        from importlib import metadata

        out["packages"]["dp-accounting"] = metadata.version("dp-accounting")
    except Exception:
        pass
    return out


async def server_health(client: AuditTarget) -> tuple[dict[str, Any] | None, str | None]:
    """The server's /healthz; an unreachable server stops the audit before it starts."""
    try:
        return await client.health(), None
    except TargetUnavailable:
        raise
    except TargetError as exc:  # a server without /healthz can still be audited
        return None, str(exc)


@contextmanager
def opened_store(
    store: TrialStore | None, db: str | Path | None, schema: str | None
) -> Iterator[TrialStore]:
    if store is not None:
        yield store
        return
    own = TrialStore(db, schema=schema)
    try:
        yield own
    finally:
        own.dispose()


def client_for(plan: AuditPlan) -> DpiclClient:
    """The plan's client: dpicl's own routes, or the OpenAI-compatible surface
    (``target.api``), whose contexts a ``target.context_hook`` may create."""
    t = plan.target
    options: dict[str, Any] = {
        "admin_token": t.admin_token.get_secret_value() if t.admin_token else None,
        "api_key": t.api_key.get_secret_value() if t.api_key else None,
        "concurrency": plan.concurrency,
        "timeout": plan.timeout,
        "retries": plan.retries,
    }
    if t.api == "openai":
        from dpicl_audit.client.context_hook import load_hook
        from dpicl_audit.client.openai import OpenAIClient

        hook = load_hook(t.context_hook, timeout=plan.timeout) if t.context_hook else None
        return OpenAIClient(t.base_url, hook=hook, **options)
    return DpiclClient(t.base_url, **options)


def need_context_maker(plan: AuditPlan, who: str) -> None:
    """Refuse a plan that cannot create its canary contexts: it needs the admin token (never
    stored in the trial log) or a context hook."""
    if plan.target.admin_token is None and not plan.target.context_hook:
        raise InvalidPlan(
            f"{who} needs the server's admin token (target.admin_token, --admin-token or "
            "DPICL_AUDIT_ADMIN_TOKEN; tokens are never stored in the trial log) to create its "
            "canary contexts, or a context hook (--api openai --context-hook) that creates them"
        )
