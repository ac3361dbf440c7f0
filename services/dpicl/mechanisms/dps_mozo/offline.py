"""DPS-MOZO's offline mode (paper 004, Algorithm 3) as request pipelines.

:func:`synthesize` runs the online pipeline (:func:`.pipeline.run_mozo`) once per public
input, charging one query each, and stores the (input, DP output) pairs as a new
context with the ``public`` mechanism, which :mod:`.public` serves as ordinary few-shot
ICL at no further privacy cost (post-processing of DP outputs). It stops between inputs when
the client has gone; what was answered until then stays charged and is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dpicl.domain import MAX_NAME_CHARS
from dpicl.engines.base import Engine
from dpicl.errors import BudgetExhausted, DpiclError, InvalidRequest
from dpicl.mechanisms.dps_mozo.accounting import MozoCalibration, mozo_cost
from dpicl.mechanisms.dps_mozo.pipeline import run_mozo
from dpicl.mechanisms.dps_mozo.public import PublicSettings
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.store.models import ContextRow
from dpicl.store.repository import ContextRepository, StoredContext, new_context_id

log = logging.getLogger("dpicl.pipelines")


#: Asked before each input of a synthesis: whether to stop there (the client has gone).
StopCheck = Callable[[], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class SynthesisOutcome:
    source: StoredContext
    derived: StoredContext | None  # None: stopped before any input was answered
    outputs: list[str]
    requested: int  # inputs asked for; more than len(outputs) when stopped early
    cost: Cost
    budget: BudgetStatus

    @property
    def complete(self) -> bool:
        return len(self.outputs) == self.requested


async def synthesize(
    context: StoredContext,
    inputs: Sequence[str],
    *,
    engine: Engine,
    ledger: Ledger,
    repo: ContextRepository,
    rng: np.random.Generator,
    name: str | None = None,
    stop: StopCheck | None = None,
) -> SynthesisOutcome:
    """Algorithm 3: DP outputs for public ``inputs``, stored as a new ``public`` context.

    Refuses up front (charging nothing) when the inputs do not fit the queries left. A
    concurrent query can still take the last ones meanwhile; then the charge of the input
    that no longer fits is refused like any other query.

    Each input is one DPS-MOZO answer, charged when its generation starts (:func:`run_mozo`).
    ``stop`` is asked before each input: when it says so (the client disconnected), no
    further input is run or charged. Whatever ends a synthesis early (a stop, an engine or
    budget error, cancellation), the inputs already answered stay charged, and their
    outputs, which were paid for, are stored as a derived context named "partial": they are
    DP outputs, so keeping them costs no privacy, and dropping them would waste budget.
    """
    _check_fits(context, inputs)
    current, outputs, failure = await _answer_inputs(
        context, inputs, engine=engine, ledger=ledger, rng=rng, stop=stop
    )
    # One ending for a finished, stopped or failed synthesis: what was answered is stored.
    derived, store_error = await _store(repo, context, inputs, outputs, name)
    if len(outputs) < len(inputs) or store_error is not None:
        _log_early_end(context, len(inputs), len(outputs), failure, derived, store_error)
    _raise_what_ended_it(context, len(outputs), failure, derived, store_error)
    cost = mozo_cost(context.record_as(MozoCalibration))
    return SynthesisOutcome(
        source=current,
        derived=derived,
        outputs=outputs,
        requested=len(inputs),
        cost=cost,
        budget=Ledger.status(current, cost),
    )


def _check_fits(context: StoredContext, inputs: Sequence[str]) -> None:
    """A dps-mozo context with a query left for every input, or a 4xx charging nothing."""
    if context.mechanism_name != "dps-mozo":
        raise InvalidRequest(
            f"context {context.id} uses mechanism {context.mechanism_name!r}; "
            "only dps-mozo contexts can synthesise demonstrations",
            param="context_id",
        )
    left = (context.max_queries or 0) - context.queries
    if len(inputs) > left:
        raise BudgetExhausted(
            f"context {context.id} has {max(left, 0)} queries left; "
            f"{len(inputs)} inputs do not fit",
            param="inputs",
        )


async def _answer_inputs(
    context: StoredContext,
    inputs: Sequence[str],
    *,
    engine: Engine,
    ledger: Ledger,
    rng: np.random.Generator,
    stop: StopCheck | None,
) -> tuple[StoredContext, list[str], BaseException | None]:
    """One DPS-MOZO answer per input, until done, stopped or failed: the context after the
    last charge, the outputs, and what ended it early (None: done or stopped). A failure
    before any output is raised as is (nothing to store)."""
    outputs: list[str] = []
    current = context
    try:
        for text in inputs:
            # Between inputs only: an input is charged as its generation starts and its
            # output exists once it ends, so stopping here leaves every charge matched by an
            # output and charges nothing that did not run.
            if stop is not None and await stop():
                break
            out = await run_mozo(current, text, engine=engine, ledger=ledger, rng=rng)
            outputs.append(out.text.strip())
            current = out.context
    except (Exception, asyncio.CancelledError) as exc:
        if not outputs:
            raise
        return current, outputs, exc
    return current, outputs, None


def _log_early_end(
    context: StoredContext,
    requested: int,
    done: int,
    failure: BaseException | None,
    derived: StoredContext | None,
    store_error: DpiclError | None,
) -> None:
    log.warning(
        "synthesis from %s ended after %d of %d inputs (%s): %d queries charged, %s",
        context.id,
        done,
        requested,
        "client gone" if failure is None else type(failure).__name__,
        done,
        f"outputs stored as {derived.id}"
        if derived is not None
        else f"outputs not stored ({type(store_error).__name__})"
        if store_error is not None
        else "nothing to store",
    )


def _raise_what_ended_it(
    context: StoredContext,
    done: int,
    failure: BaseException | None,
    derived: StoredContext | None,
    store_error: DpiclError | None,
) -> None:
    """Raise the failure that ended a synthesis, or the store's, saying what stays charged
    and where the answered outputs are; nothing when it finished or was stopped."""
    charged = f"({done} queries of {context.id})"
    if failure is not None:
        if not isinstance(failure, DpiclError):
            raise failure
        answered = "input 0" if done == 1 else f"inputs 0 to {done - 1}"
        where = (
            f"their outputs were stored as context {derived.id}"
            if derived is not None
            else "their outputs could not be stored"
        )
        raise type(failure)(
            f"{failure.message} (at input {done}). The {answered}, answered before, stay "
            f"charged {charged}; {where}",
            param=failure.param,
        ) from failure
    if store_error is not None:
        # The repository's own message ("nothing was changed or charged") is not true here:
        # every answered input was charged as it ran.
        raise type(store_error)(
            f"the database failed while storing the synthesis ({type(store_error).__name__}): "
            f"the {done} answered inputs stay charged {charged} but their outputs were not "
            "stored",
            param=store_error.param,
        ) from store_error


def _derived_name(context: StoredContext, name: str | None, answered: int, requested: int) -> str:
    base = name if name is not None else context.name or context.id
    suffix = "" if name is not None else " (synthetic)"
    if answered < requested:
        suffix += f" (partial: {answered} of {requested} inputs)"
    # The name column holds MAX_NAME_CHARS: a source named with all of them plus the
    # suffix overflowed it (PostgreSQL refuses, after every output had been paid for).
    return base[: MAX_NAME_CHARS - len(suffix)] + suffix


async def _store_derived(
    repo: ContextRepository,
    context: StoredContext,
    inputs: Sequence[str],
    outputs: list[str],
    name: str | None,
) -> StoredContext:
    """The ``public`` context of the (input, output) pairs answered so far."""
    mech = PublicSettings(
        max_tokens=context.record_as(MozoCalibration).max_tokens, derived_from=context.id
    ).model_dump()
    row = ContextRow(
        id=new_context_id(),
        name=_derived_name(context, name, len(outputs), len(inputs)),
        task="generation",
        labels=[],
        exemplars=[{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=False)],
        template=context.template,
        mechanism=mech,
        budget=None,
        mu2_spent=0.0,
        mu2_max=None,
        queries=0,
        max_queries=None,
        # Whoever reaches the source reaches what was derived from it.
        tenant=context.tenant,
    )
    return await repo.add(row)


async def _store(
    repo: ContextRepository,
    context: StoredContext,
    inputs: Sequence[str],
    outputs: list[str],
    name: str | None,
) -> tuple[StoredContext | None, DpiclError | None]:
    """:func:`_store_derived` when there is anything to store; a database failure is
    returned (the caller says what stays charged), not raised."""
    if not outputs:
        return None, None
    try:
        # Shielded: a cancelled request (shutdown) still keeps what it paid for.
        return await asyncio.shield(_store_derived(repo, context, inputs, outputs, name)), None
    except DpiclError as exc:
        return None, exc
