"""The audit plan's budgets: how many answers each of its contexts is budgeted for, how many
one context can hold, and the ledger probe of a Gaussian mechanism (:mod:`.ledger` has the
composition and the probe's checks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpicl_audit.client import AuditTarget, GenerationTarget
from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.plan import AuditPlan
from dpicl_audit.planning.ledger import answers_within_budget, audit_ledger, planned_queries
from dpicl_audit.planning.schedule import trial_worlds

__all__ = ["context_capacity", "planned_answers", "probe_ledger"]


def planned_answers(plan: AuditPlan, epsilon: float, world: int, cap: int | None) -> int:
    """The answers one context of ``world`` at ``epsilon`` is asked at most: its trials (or
    its bootstrap collection), capped by ``cap`` (the mechanism's queries per context, e.g.
    :func:`context_capacity`), with a retry margin."""

    eps = [float(e) for e in plan.mechanism.epsilons]
    k = eps.index(float(epsilon)) if float(epsilon) in eps else 0
    n = max(int((trial_worlds(plan.seed, k, plan.trials) == world).sum()), 1)
    return planned_queries(min(max(n, plan.bootstrap.n_llm), cap or n + plan.bootstrap.n_llm))


def context_capacity(plan: AuditPlan) -> int | None:
    """The trials one context may be budgeted for within the largest budget a server takes
    (ledger.answers_within_budget) at the plan's largest epsilon, where some world's trials
    need more (None: one context per world holds them all)."""

    cap = answers_within_budget(max(plan.mechanism.epsilons), plan.mechanism.delta)
    most = max(
        max(int((w == 1).sum()), int((w == 0).sum()))
        for w in (
            trial_worlds(plan.seed, k, plan.trials) for k in range(len(plan.mechanism.epsilons))
        )
    )
    return None if most <= cap else cap


async def probe_ledger(
    mech: Any, target: AuditTarget, design: Any, plan: AuditPlan
) -> dict[str, Any] | None:
    """A probe context of C0's body at the plan's first epsilon, asked the audit query until
    refused (:func:`dpicl_audit.planning.ledger.audit_ledger`); None for designs without one
    query."""

    if getattr(design, "attack", None) != "inquery":
        return None
    eps = float(plan.mechanism.epsilons[0])
    body = mech.context_body(design, plan, eps, 0, name=f"dpicl-audit {plan.seed} probe")
    max_tokens = plan.mechanism.max_tokens if mech.task == "generation" else None

    async def ask(cid: str) -> Mapping[str, Any]:
        if max_tokens is None:
            return await target.classify(cid, design.query)
        if not isinstance(target, GenerationTarget):
            raise TargetProtocolError("the target has no generate endpoint")
        return await target.generate(cid, design.query, max_tokens=max_tokens)

    return await audit_ledger(target, body, design.query, ask=ask)
