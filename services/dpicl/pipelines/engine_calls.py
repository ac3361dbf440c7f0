"""Pay first, refund on failure: the one place where the ledger meets the engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from dpicl.errors import DpiclError, EngineError
from dpicl.privacy.ledger import Cost, Ledger
from dpicl.store.repository import StoredContext

T = TypeVar("T")
log = logging.getLogger("dpicl.pipelines")


async def paid_engine_call(
    ledger: Ledger,
    context: StoredContext,
    cost: Cost,
    engine_name: str,
    work: Coroutine[Any, Any, T],
    *,
    on_charged: Callable[[StoredContext], Awaitable[None]] | None = None,
    released: Callable[[], bool] | None = None,
) -> tuple[StoredContext, T]:
    """Charge ``cost``, then run ``work``; refund and raise :class:`EngineError` if it fails.

    Charging first means a refused query never reaches the engine, and concurrent queries
    can never together overspend; refunding means an engine failure costs nothing (its
    output was never seen by anyone). ``on_charged`` hears the charged context before the
    work starts (a stream's headers); ``released`` says whether the work has already let
    part of its output out (a streamed token): a failure after that is not refunded, since
    the part that left was paid for by this charge.
    """
    try:
        receipt = await ledger.charge(context, cost)
    except BaseException:
        work.close()  # never started: do not leave an un-awaited coroutine behind
        raise
    if on_charged is not None:
        try:
            await on_charged(receipt.context)
        except BaseException:
            work.close()
            # Charged, but nothing ran: nothing was released, so nothing is owed.
            await asyncio.shield(ledger.refund(receipt))
            raise
    try:
        result = await work
    except Exception as exc:
        if released is not None and released():
            await ledger.settle(receipt)
            log.warning("the %s engine failed mid-stream: %s", engine_name, type(exc).__name__)
            raise EngineError(
                f"the {engine_name} engine failed ({type(exc).__name__}) after part of the "
                "answer was streamed; the answer stays charged"
            ) from None
        await ledger.refund(receipt)
        if isinstance(exc, DpiclError):
            raise
        # The exception's text may quote a prompt (private exemplars) or a file path: the
        # client and the log get its type only.
        log.warning("the %s engine failed: %s", engine_name, type(exc).__name__)
        raise EngineError(
            f"the {engine_name} engine failed ({type(exc).__name__}); nothing was charged"
        ) from None
    except BaseException:
        # Cancelled (client gone, shutdown): the output may exist, so the charge stands.
        await asyncio.shield(ledger.settle(receipt))
        raise
    await ledger.settle(receipt)
    return receipt.context, result
