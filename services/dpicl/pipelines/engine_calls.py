"""Pay first, refund on failure: the one place where the ledger meets the engine."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from dpicl.errors import DpiclError, EngineError
from dpicl.privacy.ledger import Cost, Ledger
from dpicl.store.repository import StoredContext

T = TypeVar("T")


async def paid_engine_call(
    ledger: Ledger,
    context: StoredContext,
    cost: Cost,
    engine_name: str,
    work: Coroutine[Any, Any, T],
) -> tuple[StoredContext, T]:
    """Charge ``cost``, then run ``work``; refund and raise :class:`EngineError` if it fails.

    Charging first means a refused query never reaches the engine, and concurrent queries
    can never together overspend; refunding means an engine failure costs nothing (its
    output was never seen by anyone).
    """
    try:
        charged = await ledger.charge(context, cost)
    except BaseException:
        work.close()  # never started: do not leave an un-awaited coroutine behind
        raise
    try:
        result = await work
    except Exception as exc:
        await ledger.refund(context, cost)
        if isinstance(exc, DpiclError) and not isinstance(exc, EngineError):
            raise
        raise EngineError(f"the {engine_name} engine failed: {exc}") from exc
    return charged, result
