"""The privacy budget ledger: a thin stateful class over :mod:`dpicl.privacy.accounting`.

State lives in the store (``mu2_spent``, ``queries`` per context); the maths lives in
accounting. A charge happens *before* the engine runs and is refunded if the engine fails,
so nothing is released without being paid for and a failure costs nothing.

What it composes are cost events (:class:`Cost`), which each mechanism declares
(``dpicl.mechanisms``): the ledger never asks which mechanism made one.

A charge that is later refunded must not make a concurrent query fail: when a charge is
refused while other charges of the same context are still *pending* in this process (their
engine call has not finished), the refused query waits until one of them settles, then
tries again. It is refused only when nothing it waits for could still be refunded. The
charge itself stays the one conditional UPDATE, so the no-overspend guarantee across
processes is untouched: waiting only changes *when* a query asks, never what it may take.
(Pending charges of other processes are not seen: there a query refused while another
process's failing call holds the last unit is refused, as before.) The same holds for a
database key's own budget: a query refused by it waits for this process's pending charges
of that key.

A key's budget (epsilon, delta) composes like a context's: in mu^2 (``accounting``), summed
over every context the key queries, whatever their data (a conservative reading: two
contexts may hold the same records).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from dpicl.errors import BudgetExhausted, InvalidRequest, NotFound, RateLimited, Unauthorized
from dpicl.privacy.accounting import remaining_queries, spent_epsilon
from dpicl.store.charges import Charged
from dpicl.store.keys import INTERNAL, Principal
from dpicl.store.repository import ContextRepository, StoredContext

#: A mechanism's own accountant: the epsilon spent after ``n`` answers of a context.
SpentCurve = Callable[[int], float]


@dataclass(frozen=True, slots=True)
class Cost:
    """One answer's cost event, as a mechanism declares it (``Mechanism.cost``): as
    configured, exactly, and in ledger units.

    The ledger composes events of two kinds, without knowing which mechanism made them:

    * ``curve`` None: a Gaussian-DP event of ``mu2`` = mu^2, added to the context's (and a
      budgeted key's) ``mu2_spent``; the spent epsilon is that of the composed GDP curve
      (:mod:`dpicl.privacy.accounting`). A pure epsilon-DP event enters the same sum
      through :func:`dpicl.privacy.accounting.pure_dp_mu2`, a conversion that is exact
      for the worst case (randomized response) and conservative for the rest, and gives
      ``pure_epsilon``: n such answers are also (n epsilon, 0)-DP (basic composition), so
      the spent epsilon reported is the smaller of the two valid bounds (admission stays
      in mu^2, the store's one conditional UPDATE).
    * ``curve`` given: the mechanism keeps its own accountant (DPS-MOZO): the context is
      budgeted in answers (``max_queries``), ``mu2`` is 0 and ``curve(n)`` is the epsilon
      of n answers. A key's mu^2 budget cannot add such a cost.
    """

    epsilon: float
    delta: float
    epsilon_exact: float | None
    mu2: float
    epsilon_total: float | None = None  # the mechanism's whole-context epsilon (DPS-MOZO)
    curve: SpentCurve | None = None
    pure_epsilon: float | None = None  # a pure epsilon-DP event's epsilon

    def spent_epsilon(self, mu2: float, answers: int, delta: float) -> float:
        """Epsilon spent by ``answers`` answers costing ``mu2`` in all, at ``delta``."""
        if self.curve is not None:
            return self.curve(answers)
        gdp = spent_epsilon(mu2, delta)
        if self.pure_epsilon is not None:
            return min(gdp, answers * self.pure_epsilon)
        return gdp


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """Spent and remaining budget of a context, as reported to clients."""

    queries: int
    spent_epsilon: float
    delta: float
    remaining_epsilon: float | None
    remaining_queries: int | None


@dataclass(frozen=True, slots=True)
class Receipt:
    """An admitted charge: the context with its ledger after it, and its spend row."""

    context: StoredContext
    cost: Cost
    spend_id: int
    principal: Principal


class _Pending:
    """Charges made by this process whose engine call has not settled, by context and key,
    shared by every :meth:`Ledger.billed_to` view of one ledger."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.settled = asyncio.Condition()
        self.settlements = 0  # bumped on every settlement; waiters watch it change


class Ledger:
    """Charges answers to a context's budget and, for a database key, to the key's own
    budget and rate limit, in one transaction (:mod:`dpicl.store.charges`).

    ``billed_to(principal)`` is the same ledger charging on behalf of ``principal`` (whose
    key id every spend row names); a bare ``Ledger(repo)`` charges as the server itself."""

    def __init__(
        self,
        repository: ContextRepository,
        principal: Principal = INTERNAL,
        *,
        _pending: _Pending | None = None,
    ) -> None:
        self._repo = repository
        self.principal = principal
        self._state = _pending if _pending is not None else _Pending()

    def billed_to(self, principal: Principal) -> Ledger:
        """This ledger, charging on behalf of ``principal``."""
        return Ledger(self._repo, principal, _pending=self._state)

    def pending(self, context_id: str) -> int:
        """Charges of ``context_id`` made by this process and not yet settled."""
        return self._state.counts.get(context_id, 0)

    def _pending_key(self) -> int:
        return self._state.counts.get("key:" + self.principal.key_id, 0)

    async def charge(self, context: StoredContext, cost: Cost) -> Receipt:
        """Charge one answer; the receipt holds the context with its ledger after the charge.

        The charge stays *pending* until :meth:`settle` (released) or :meth:`refund`.
        Raises :class:`BudgetExhausted` (the context's or the key's budget),
        :class:`RateLimited`, :class:`Unauthorized` (the key was revoked meanwhile) or
        :class:`NotFound` (the context was deleted meanwhile), having charged nothing.
        """
        p = self.principal
        if p.budgeted and cost.curve is not None:
            # A key's budget composes Gaussian costs in mu^2; a mechanism with its own
            # accountant (budgeted in queries) has no mu^2 to add.
            raise InvalidRequest(
                f"key {p.key_id} has a privacy budget, which composes the Gaussian (mu^2) "
                f"costs of answers; context {context.id} uses "
                f"{context.mechanism_name}, whose cost it cannot add: query it with a "
                "key without a privacy budget",
                param="context_id",
            )
        req = self._repo.charge_request(context.id, p, cost.mu2, cost.epsilon, cost.delta)
        while True:
            seen = self._state.settlements
            out = await self._repo.charge(req)
            if isinstance(out, Charged):
                self._add_pending(context.id, 1)
                if p.stored:
                    self._add_pending("key:" + p.key_id, 1)
                after = replace(context, mu2_spent=out.mu2_spent, queries=out.queries)
                return Receipt(context=after, cost=cost, spend_id=out.spend_id, principal=p)
            if out.reason == "revoked":
                raise Unauthorized("this API key was revoked")
            if out.reason == "rate":
                raise RateLimited(
                    f"key {p.key_id} is over its rate limit; retry in {out.retry_after_s} s",
                    retry_after_s=out.retry_after_s,
                )
            waits = self.pending(context.id) if out.reason == "context" else self._pending_key()
            if waits == 0:
                break
            # Another answer of this context (or key) is in flight and may yet be refunded:
            # ask again once something settled (at once if it settled while we asked).
            await self._wait_settlement_after(seen)
        await self._repo.record_refusal(req)
        if out.reason == "key_budget":
            # The key's budget, not the context's: the value at fault is the key, which the
            # Authorization header carries (another context would be refused the same).
            raise BudgetExhausted(
                f"key {p.key_id} cannot afford another answer: its own privacy budget is "
                "exhausted (every context it queries draws on it; the context's may have more)",
                param="authorization",
            )
        if await self._repo.get(context.id) is None:
            raise NotFound(f"no context with id {context.id!r}", param="context_id")
        budget = context.budget or {}
        raise BudgetExhausted(
            f"context {context.id} cannot afford another answer: its budget "
            f"(epsilon={budget.get('epsilon')}, delta={budget.get('delta')}, "
            f"max_queries={context.max_queries}) is exhausted",
            param="context_id",
        )

    def _add_pending(self, name: str, n: int) -> None:
        left = self._state.counts.get(name, 0) + n
        if left > 0:
            self._state.counts[name] = left
        else:
            self._state.counts.pop(name, None)

    async def _wait_settlement_after(self, seen: int) -> None:
        async with self._state.settled:
            await self._state.settled.wait_for(lambda: self._state.settlements != seen)

    async def settle(self, receipt: Receipt) -> None:
        """A pending charge's answer was released (or may have been): it stays paid."""
        await self._done(receipt)

    async def refund(self, receipt: Receipt) -> None:
        """Undo a pending charge whose answer was never released (the engine failed)."""
        c = receipt.cost
        req = self._repo.charge_request(
            receipt.context.id, receipt.principal, c.mu2, c.epsilon, c.delta
        )
        try:
            await self._repo.refund_charge(req, receipt.spend_id)
        finally:
            await self._done(receipt)

    async def _done(self, receipt: Receipt) -> None:
        self._add_pending(receipt.context.id, -1)
        if receipt.principal.stored:
            self._add_pending("key:" + receipt.principal.key_id, -1)
        async with self._state.settled:
            self._state.settlements += 1
            self._state.settled.notify_all()

    @staticmethod
    def status(context: StoredContext, cost: Cost) -> BudgetStatus:
        """The context's spent and remaining budget, composed from ``cost`` (one answer's
        event: every answer of a context costs the same)."""
        delta = context.budget["delta"] if context.budget else cost.delta
        spent = cost.spent_epsilon(context.mu2_spent, context.queries, delta)
        remaining_eps: float | None = None
        left: int | None = None
        if context.budget is not None:
            remaining_eps = max(context.budget["epsilon"] - spent, 0.0)
            if context.mu2_max is not None:
                left = remaining_queries(context.mu2_spent, context.mu2_max, cost.mu2)
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
