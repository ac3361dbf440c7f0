"""DPS-MOZO's offline mode (paper 004, Algorithm 3) as request pipelines.

:func:`synthesize` runs the online pipeline (:func:`dpicl.pipelines.mozo.run_mozo`) once per
public input, charging one query each, and stores the (input, DP output) pairs as a new
context with the ``public`` mechanism, which :func:`run_public` serves as ordinary few-shot
ICL at no further privacy cost (post-processing of DP outputs). It stops between inputs when
the client has gone; what was answered until then stays charged and is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dpicl.domain import MAX_NAME_CHARS, PublicSettings
from dpicl.engines.base import Engine, Exemplar, GenerationParams
from dpicl.errors import BudgetExhausted, DpiclError, InvalidRequest
from dpicl.pipelines.contexts import cost_of
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.pipelines.mozo import run_mozo
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.privacy.randomness import entropy_seed
from dpicl.prompts import render
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
    if context.mechanism.get("name") != "dps-mozo":
        raise InvalidRequest(
            f"context {context.id} uses mechanism {context.mechanism.get('name')!r}; "
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
        kept = await _keep_partial(repo, context, inputs, outputs, name)
        if isinstance(exc, DpiclError):
            done = len(outputs)
            answered = "input 0" if done == 1 else f"inputs 0 to {done - 1}"
            where = (
                f"their outputs were stored as context {kept.id}"
                if kept is not None
                else "their outputs could not be stored"
            )
            raise type(exc)(
                f"{exc.message} (at input {done}). The {answered}, answered before, stay "
                f"charged ({done} queries of {context.id}); {where}",
                param=exc.param,
            ) from exc
        raise
    try:
        derived = await _store_derived(repo, context, inputs, outputs, name) if outputs else None
    except DpiclError as exc:
        # The repository's own message ("nothing was changed or charged") is not true here:
        # every answered input was charged as it ran.
        raise type(exc)(
            f"the database failed while storing the synthesis ({type(exc).__name__}): the "
            f"{len(outputs)} answered inputs stay charged ({len(outputs)} queries of "
            f"{context.id}) but their outputs were not stored",
            param=exc.param,
        ) from exc
    if len(outputs) < len(inputs):
        log.info(
            "synthesis from %s stopped after %d of %d inputs (client gone): %d queries "
            "charged, outputs stored as %s",
            context.id,
            len(outputs),
            len(inputs),
            len(outputs),
            derived.id if derived is not None else "(none)",
        )
    cost = cost_of(context)
    return SynthesisOutcome(
        source=current,
        derived=derived,
        outputs=outputs,
        requested=len(inputs),
        cost=cost,
        budget=Ledger.status(current, cost),
    )


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
        max_tokens=int(context.mechanism["max_tokens"]), derived_from=context.id
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
    )
    return await repo.add(row)


async def _keep_partial(
    repo: ContextRepository,
    context: StoredContext,
    inputs: Sequence[str],
    outputs: list[str],
    name: str | None,
) -> StoredContext | None:
    """Store the outputs of a synthesis that failed midway; None if that fails too."""
    try:
        # Shielded: a cancelled request (shutdown) still keeps what it paid for.
        kept = await asyncio.shield(_store_derived(repo, context, inputs, outputs, name))
    except Exception as exc:
        log.warning(
            "synthesis from %s failed after %d paid inputs, whose outputs could not be "
            "stored either (%s)",
            context.id,
            len(outputs),
            type(exc).__name__,
        )
        return None
    log.warning(
        "synthesis from %s failed after %d of %d inputs: %d queries charged, outputs stored as %s",
        context.id,
        len(outputs),
        len(inputs),
        len(outputs),
        kept.id,
    )
    return kept


@dataclass(frozen=True, slots=True)
class PublicOutcome:
    context: StoredContext
    text: str
    cost: Cost
    budget: BudgetStatus


async def run_public(
    context: StoredContext,
    query: str,
    *,
    engine: Engine,
    ledger: Ledger,
    max_tokens: int | None = None,
) -> PublicOutcome:
    """Plain few-shot generation with every (public) exemplar in the prompt; costs nothing."""
    m = context.mechanism
    prompt = render(
        context.template,
        [Exemplar(input=i, output=o) for i, o in context.exemplars],
        query,
        task=context.task,
        cache_scope=context.id,
    )
    params = GenerationParams(
        max_tokens=int(max_tokens or m["max_tokens"]),
        temperature=float(m["temperature"]),
        seed=entropy_seed(),
    )
    cost = cost_of(context)
    charged, texts = await paid_engine_call(
        ledger, context, cost, engine.name, engine.generate([prompt], params)
    )
    return PublicOutcome(
        context=charged, text=texts[0], cost=cost, budget=Ledger.status(charged, cost)
    )
