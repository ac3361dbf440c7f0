"""The privacy budget ledger: a thin stateful class over :mod:`dpicl.privacy.accounting`.

State lives in the store (``mu2_spent``, ``queries`` per context); the maths lives in
accounting. A charge happens *before* the engine runs and is refunded if the engine fails,
so nothing is released without being paid for and a failure costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dpicl.errors import BudgetExhausted, NotFound
from dpicl.privacy.accounting import remaining_queries, spent_epsilon
from dpicl.privacy.mozo_calibration import mozo_epsilon
from dpicl.privacy.mozo_proven import proven_epsilon
from dpicl.store.repository import ContextRepository, StoredContext


@dataclass(frozen=True, slots=True)
class Cost:
    """What one answer costs: as configured, exactly, and in ledger units (mu^2)."""

    epsilon: float
    delta: float
    epsilon_exact: float | None
    mu2: float
    epsilon_total: float | None = None  # the mechanism's whole-context epsilon (DPS-MOZO)


def guarantee_of(mechanism: dict[str, Any]) -> str:
    """``"proven"`` or ``"paper"``; contexts stored before the proven mode existed are
    paper-mode contexts."""
    return str(mechanism.get("guarantee", "paper"))


def mozo_spent_epsilon(mechanism: dict[str, Any], queries: int) -> float:
    """(epsilon, delta)-DP epsilon of ``queries`` DPS-MOZO answers of T_max tokens each.

    Every answer is charged its full T_max tokens whatever it generated (stopping early is a
    function of the released tokens), so after all ``mechanism["queries"]`` answers this is
    at most the configured epsilon. Proven mode: the exact optimal composition of the
    amplified per-token pure DP (:mod:`dpicl.privacy.mozo_proven`). Paper mode (nominal): the
    conversion takes the best order up to alpha.
    """
    tokens = queries * int(mechanism["max_tokens"])
    if guarantee_of(mechanism) == "proven":
        return proven_epsilon(
            float(mechanism["max_log_ratio"]),
            int(mechanism["n_shots"]),
            float(mechanism["sample_rate"]),
            tokens,
            float(mechanism["delta"]),
        )
    return mozo_epsilon(
        float(mechanism["beta"]),
        int(mechanism["alpha"]),
        tokens,
        float(mechanism["sample_rate"]),
        float(mechanism["delta"]),
        optimize_order=True,
    )


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """Spent and remaining budget of a context, as reported to clients."""

    queries: int
    spent_epsilon: float
    delta: float
    remaining_epsilon: float | None
    remaining_queries: int | None


class Ledger:
    def __init__(self, repository: ContextRepository) -> None:
        self._repo = repository

    async def charge(self, context: StoredContext, cost: Cost) -> StoredContext:
        """Charge one answer and return the context with its ledger after the charge.

        Raises :class:`BudgetExhausted` (or :class:`NotFound` if the context was deleted
        meanwhile) having charged nothing.
        """
        after = await self._repo.try_charge(context.id, cost.mu2)
        if after is None:
            if await self._repo.get(context.id) is None:
                raise NotFound(f"no context with id {context.id!r}", param="context_id")
            budget = context.budget or {}
            raise BudgetExhausted(
                f"context {context.id} cannot afford another answer: its budget "
                f"(epsilon={budget.get('epsilon')}, delta={budget.get('delta')}, "
                f"max_queries={context.max_queries}) is exhausted",
                param="context_id",
            )
        return replace(context, mu2_spent=after[0], queries=after[1])

    async def refund(self, context: StoredContext, cost: Cost) -> None:
        await self._repo.refund(context.id, cost.mu2)

    @staticmethod
    def status(context: StoredContext, cost: Cost) -> BudgetStatus:
        delta = context.budget["delta"] if context.budget else cost.delta
        name = context.mechanism.get("name")
        if name == "dps-mozo":
            spent = mozo_spent_epsilon(context.mechanism, context.queries)
        elif name == "public":
            spent = 0.0
        else:
            spent = spent_epsilon(context.mu2_spent, delta)
        remaining_eps: float | None = None
        left: int | None = None
        if context.mu2_max is not None and context.budget is not None:
            remaining_eps = max(context.budget["epsilon"] - spent, 0.0)
            left = remaining_queries(context.mu2_spent, context.mu2_max, cost.mu2)
        elif name == "dps-mozo" and context.budget is not None:
            remaining_eps = max(context.budget["epsilon"] - spent, 0.0)
        if context.max_queries is not None:
            by_count = max(context.max_queries - context.queries, 0)
            left = by_count if left is None else min(left, by_count)
        return BudgetStatus(
            queries=context.queries,
            spent_epsilon=spent,
            delta=delta,
            remaining_epsilon=remaining_eps,
            remaining_queries=left,
        )
