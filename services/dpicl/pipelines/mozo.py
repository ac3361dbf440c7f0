"""DPS-MOZO (paper 004, Algorithms 1-3) as request pipelines.

Online (Algorithm 2): query -> |D| one-shot prompts + the zero-shot prompt, opened as ONE
decoding session (the KV cache holds every exemplar's prompt once) -> per token: n_shots
exemplars sampled without replacement, the zero-shot top-k, :func:`mozo_step` on the sampled
rows, advance every row with the chosen token -> stop at EOS or T_max. Each answer is charged
first (one query of the context's ``max_queries``) and refunded if the engine fails.

Offline (Algorithm 3): :func:`synthesize` runs the online pipeline once per public input,
charging one query each, and stores the (input, DP output) pairs as a new context with the
``public`` mechanism, which :func:`run_public` serves as ordinary few-shot ICL at no further
privacy cost (post-processing of DP outputs). It stops between inputs when the client has
gone; what was answered until then stays charged and is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from dpicl.domain import MAX_NAME_CHARS, PublicSettings
from dpicl.engines.base import Engine, Exemplar, GenerationParams, PromptSpec
from dpicl.errors import BudgetExhausted, DpiclError, InvalidRequest
from dpicl.mechanisms.mozo import (
    exact_shot_divergence,
    exact_shot_log_ratio,
    mixed_logits,
    mozo_step,
    sample_shots,
)
from dpicl.pipelines.contexts import cost_of, exemplars_of
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.pipelines.partitions import zero_shot_prompt
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger, guarantee_of
from dpicl.privacy.randomness import entropy_seed
from dpicl.prompts import render
from dpicl.store.models import ContextRow
from dpicl.store.repository import ContextRepository, StoredContext, new_context_id

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

log = logging.getLogger("dpicl.pipelines")


@dataclass(frozen=True, slots=True)
class MozoToken:
    """Diagnostics of one generated token (``exact`` only when asked for)."""

    token_id: int
    shots: IntArray  # (n_shots,) exemplar indices sampled for this token
    top_ids: IntArray  # (k,)
    lambdas: FloatArray  # (n_shots,)
    log_ratios: FloatArray  # (n_shots,): max |log mixed - log zero|
    divergences: FloatArray | None  # paper mode (n_shots, 2): D(mixed||zero), D(zero||mixed)
    mixed_probs: FloatArray  # (n_shots, k)
    zero_probs: FloatArray  # (k,)
    product_probs: FloatArray  # (k,)
    exact: FloatArray | None  # paper mode (n_shots, 2) exact_shot_divergence, when asked
    exact_log_ratios: FloatArray | None  # (n_shots,) exact_shot_log_ratio, when asked


@dataclass(frozen=True, slots=True)
class MozoOutcome:
    context: StoredContext
    text: str
    token_ids: list[int]
    tokens: list[MozoToken]
    stopped_at_eos: bool
    cost: Cost
    budget: BudgetStatus


@dataclass(frozen=True, slots=True)
class _Decoded:
    token_ids: list[int]
    tokens: list[MozoToken]
    text: str
    eos: bool


def mozo_prompts(context: StoredContext, query: str) -> list[PromptSpec]:
    """One one-shot prompt per exemplar (in context order), then the zero-shot prompt.

    A one-shot prompt that does not fit the model falls back to the zero-shot prompt
    (``PromptSpec.fallback``): that shot's distribution is then p0 itself, within eps0 of p0
    (and within any Renyi radius), so the guarantee holds, while a refusal would depend on
    the exemplar's length."""
    zero = zero_shot_prompt(context, query)
    one_shot = [
        replace(
            render(
                context.template,
                [e],
                query,
                task=context.task,
                labels=context.labels,
                cache_scope=context.id,
            ),
            fallback=zero,
        )
        for e in exemplars_of(context)
    ]
    return [*one_shot, zero]


async def mozo_decode(
    engine: Engine,
    prompts: Sequence[PromptSpec],
    *,
    n_shots: int,
    top_k: int,
    max_tokens: int,
    beta: float | None,
    alpha: int | None,
    lam_max: float,
    rng: np.random.Generator,
    eps0: float | None = None,
    exact: bool = False,
    private: bool = True,
) -> _Decoded:
    """The decoding loop over one session; ``prompts[-1]`` is the zero-shot prompt.

    ``eps0`` given: the proven mode (max-log-ratio constraint); else the paper's at
    ``(beta, alpha)``.

    ``private=False`` is the non-private ensemble baseline of the benchmark: the same loop
    and the same sampled shots, but the token is drawn from the normalised product of the
    raw one-shot distributions (no lambda search, no mixing).
    """
    n_exemplars = len(prompts) - 1
    session = await engine.open_decoding(prompts, zero_shot_index=n_exemplars, top_k=top_k)
    token_ids: list[int] = []
    tokens: list[MozoToken] = []
    eos = False
    try:
        for t in range(max_tokens):
            step = await session.step()
            shots = sample_shots(n_exemplars, n_shots, rng)
            one = step.logits[shots]
            if private:
                zero = step.logits[n_exemplars]
                st = mozo_step(
                    one, zero, step.top_ids, beta, alpha, rng, lam_max=lam_max, eps0=eps0
                )
                mixed = mixed_logits(one, zero, st.lambdas)
                tokens.append(
                    MozoToken(
                        token_id=st.token_id,
                        shots=shots,
                        top_ids=st.top_ids,
                        lambdas=st.lambdas,
                        log_ratios=st.log_ratios,
                        divergences=st.divergences,
                        mixed_probs=st.mixed_probs,
                        zero_probs=st.zero_probs,
                        product_probs=st.product_probs,
                        exact=(
                            exact_shot_divergence(mixed, zero, alpha)
                            if exact and eps0 is None and alpha is not None
                            else None
                        ),
                        exact_log_ratios=exact_shot_log_ratio(mixed, zero) if exact else None,
                    )
                )
                token = st.token_id
            else:
                log_p = one - one.max(axis=1, keepdims=True)
                log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
                total = log_p.sum(axis=0)
                probs = np.exp(total - total.max())
                token = int(step.top_ids[int(rng.choice(probs.size, p=probs / probs.sum()))])
            if token == session.eos_token_id:
                eos = True
                break
            token_ids.append(token)
            if t + 1 < max_tokens:
                await session.advance(token)
        text = session.decode(token_ids)
    finally:
        await session.aclose()
    return _Decoded(token_ids=token_ids, tokens=tokens, text=text, eos=eos)


def _max_tokens(context: StoredContext, max_tokens: int | None) -> int:
    t_max = int(context.mechanism["max_tokens"])
    if max_tokens is None:
        return t_max
    if max_tokens > t_max:
        raise InvalidRequest(
            f"max_tokens={max_tokens} exceeds the context's calibrated T_max={t_max}",
            param="max_tokens",
        )
    return max_tokens


async def run_mozo(
    context: StoredContext,
    query: str,
    *,
    engine: Engine,
    ledger: Ledger,
    rng: np.random.Generator,
    max_tokens: int | None = None,
    exact: bool = False,
) -> MozoOutcome:
    """One DPS-MOZO answer: charged one query first, refunded if the engine fails."""
    m = context.mechanism
    tokens = _max_tokens(context, max_tokens)
    cost = cost_of(context)
    proven = guarantee_of(m) == "proven"
    charged, out = await paid_engine_call(
        ledger,
        context,
        cost,
        engine.name,
        mozo_decode(
            engine,
            mozo_prompts(context, query),
            n_shots=int(m["n_shots"]),
            top_k=int(m["top_k"]),
            max_tokens=tokens,
            beta=None if proven else float(m["beta"]),
            alpha=None if proven else int(m["alpha"]),
            lam_max=float(m["lambda_max"]),
            rng=rng,
            eps0=float(m["max_log_ratio"]) if proven else None,
            exact=exact,
        ),
    )
    return MozoOutcome(
        context=charged,
        text=out.text,
        token_ids=out.token_ids,
        tokens=out.tokens,
        stopped_at_eos=out.eos,
        cost=cost,
        budget=Ledger.status(charged, cost),
    )


# --------------------------------------------------------------------------- offline mode


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
