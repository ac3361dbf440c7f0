"""The privacy budget ledger: a thin stateful class over :mod:`dpicl.privacy.accounting`.

State lives in the store (``mu2_spent``, ``queries`` per context); the maths lives in
accounting. A charge happens *before* the engine runs and is refunded if the engine fails,
so nothing is released without being paid for and a failure costs nothing.

A charge that is later refunded must not make a concurrent query fail: when a charge is
refused while other charges of the same context are still *pending* in this process (their
engine call has not finished), the refused query waits until one of them settles, then
tries again. It is refused only when nothing it waits for could still be refunded. The
charge itself stays the one conditional UPDATE, so the no-overspend guarantee across
processes is untouched: waiting only changes *when* a query asks, never what it may take.
(Pending charges of other processes are not seen: there a query refused while another
process's failing call holds the last unit is refused, as before.)
"""

from __future__ import annotations

import asyncio
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
        # context id -> charges made here whose engine call has not settled yet.
        self._pending: dict[str, int] = {}
        self._settled = asyncio.Condition()
        self._settlements = 0  # bumped on every settlement; waiters watch it change

    def pending(self, context_id: str) -> int:
        """Charges of ``context_id`` made by this process and not yet settled."""
        return self._pending.get(context_id, 0)

    async def charge(self, context: StoredContext, cost: Cost) -> StoredContext:
        """Charge one answer and return the context with its ledger after the charge.

        The charge stays *pending* until :meth:`settle` (released) or :meth:`refund`.
        Raises :class:`BudgetExhausted` (or :class:`NotFound` if the context was deleted
        meanwhile) having charged nothing.
        """
        while True:
            seen = self._settlements
            after = await self._repo.try_charge(context.id, cost.mu2)
            if after is not None:
                self._pending[context.id] = self.pending(context.id) + 1
                return replace(context, mu2_spent=after[0], queries=after[1])
            if self.pending(context.id) == 0:
                break
            # Another answer of this context is in flight and may yet be refunded: ask
            # again once something settled (at once if it settled while we asked).
            await self._wait_settlement_after(seen)
        if await self._repo.get(context.id) is None:
            raise NotFound(f"no context with id {context.id!r}", param="context_id")
        budget = context.budget or {}
        raise BudgetExhausted(
            f"context {context.id} cannot afford another answer: its budget "
            f"(epsilon={budget.get('epsilon')}, delta={budget.get('delta')}, "
            f"max_queries={context.max_queries}) is exhausted",
            param="context_id",
        )

    async def _wait_settlement_after(self, seen: int) -> None:
        async with self._settled:
            await self._settled.wait_for(lambda: self._settlements != seen)

    async def settle(self, context: StoredContext) -> None:
        """A pending charge's answer was released (or may have been): it stays paid."""
        await self._done(context.id)

    async def refund(self, context: StoredContext, cost: Cost) -> None:
        """Undo a pending charge whose answer was never released (the engine failed)."""
        try:
            await self._repo.refund(context.id, cost.mu2)
        finally:
            await self._done(context.id)

    async def _done(self, context_id: str) -> None:
        left = self.pending(context_id) - 1
        if left > 0:
            self._pending[context_id] = left
        else:
            self._pending.pop(context_id, None)
        async with self._settled:
            self._settlements += 1
            self._settled.notify_all()

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
