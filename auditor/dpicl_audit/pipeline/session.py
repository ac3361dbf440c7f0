"""What a run opens: the trial log, the HTTP client, the server's health, the versions
recorded with the run (auditor, Python, packages, the server's ``/healthz``), and what the
plan takes from the health: the largest budget the server takes (its published ``limits``)."""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypedDict

import numpy as np

from dpicl_audit import __version__
from dpicl_audit.client import AuditTarget, ContextBody, DpiclClient
from dpicl_audit.client.context_hook import load_hook
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.errors import InvalidPlan, TargetError, TargetUnavailable
from dpicl_audit.estimators.composition import MAX_BUDGET_EPSILON
from dpicl_audit.jsontypes import JsonMapping, JsonObject, JsonValue
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.budgets import budget_limit, published_budget_limit
from dpicl_audit.plan.specs import TargetSpec
from dpicl_audit.store import TrialStore

__all__ = [
    "client_for",
    "need_context_maker",
    "opened_store",
    "refuse_unbudgeted",
    "run_versions",
    "server_health",
    "with_budget_limit",
]


def run_versions(health: JsonMapping | None, error: str | None = None) -> JsonObject:
    import httpx
    import scipy
    import sqlalchemy

    packages: dict[str, JsonValue] = {
        "httpx": httpx.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "sqlalchemy": sqlalchemy.__version__,
    }
    try:
        from importlib import metadata

        packages["dp-accounting"] = metadata.version("dp-accounting")
    except Exception:
        pass
    return {
        "auditor": __version__,
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "packages": packages,
        "server": dict(health) if health is not None else {"error": error},
    }


async def server_health(client: AuditTarget) -> tuple[JsonMapping | None, str | None]:
    """The server's /healthz; an unreachable server stops the audit before it starts."""
    try:
        return await client.health(), None
    except TargetUnavailable:
        raise
    except TargetError as exc:  # a server without /healthz can still be audited
        return None, str(exc)


def with_budget_limit(target: TargetSpec, health: JsonMapping | None) -> TargetSpec:
    """The plan's target with ``max_budget_epsilon`` resolved: the lower of the plan's and
    the one the server publishes (``limits.max_budget_epsilon`` of its /healthz), 1000 where
    neither says (a server older than the field: every dpicl server takes that much)."""
    said = (target.max_budget_epsilon, published_budget_limit(health))
    limit = min([float(v) for v in said if v is not None] + [MAX_BUDGET_EPSILON])
    return target.model_copy(update={"max_budget_epsilon": limit})


def refuse_unbudgeted(
    mechanism: Any, design: Any, plan: AuditPlan, health: JsonMapping | None
) -> None:
    """Refuse, before anything is created, a plan some of whose contexts would go unbudgeted
    (their epsilon's one answer is above the server's largest budget) against a server that
    publishes that it refuses unbudgeted contexts (``limits.allow_unbudgeted`` false)."""
    limits = (health or {}).get("limits")
    if not isinstance(limits, Mapping) or limits.get("allow_unbudgeted") is not False:
        return
    bad = [
        float(eps)
        for eps in plan.mechanism.epsilons
        for world in (1, 0)
        if _unbudgeted(mechanism.context_body(design, plan, eps, world, name="budget check"))
    ]
    if bad:
        raise InvalidPlan(
            f"epsilon {sorted(set(bad))} needs an unbudgeted context: one answer is above "
            f"the server's largest budget, epsilon {budget_limit(plan):g} "
            "(DPICL_MAX_BUDGET_EPSILON), and it refuses unbudgeted contexts "
            "(DPICL_ALLOW_UNBUDGETED is off); audit smaller epsilons"
        )


def _unbudgeted(body: ContextBody) -> bool:
    return "budget" in body and body["budget"] is None


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


class ClientPlan(Protocol):
    """What a client is built from: an audit plan's or a utility plan's target and
    transport settings."""

    @property
    def target(self) -> TargetSpec: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def timeout(self) -> float: ...
    @property
    def retries(self) -> int: ...


class _ClientOptions(TypedDict):
    """What both clients take beside the base URL (client.http.DpiclClient)."""

    admin_token: str | None
    api_key: str | None
    concurrency: int
    timeout: float
    retries: int


def client_for(plan: ClientPlan) -> DpiclClient:
    """The plan's client: dpicl's own routes, or the OpenAI-compatible surface
    (``target.api``), whose contexts a ``target.context_hook`` may create."""
    t = plan.target
    options: _ClientOptions = {
        "admin_token": t.admin_token.get_secret_value() if t.admin_token else None,
        "api_key": t.api_key.get_secret_value() if t.api_key else None,
        "concurrency": plan.concurrency,
        "timeout": plan.timeout,
        "retries": plan.retries,
    }
    if t.api == "openai":
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
