"""DPS-MOZO (paper 004, Algorithms 1-3) as request pipelines.

Online (Algorithm 2): query -> |D| one-shot prompts + the zero-shot prompt, opened as ONE
decoding session (the KV cache holds every exemplar's prompt once) -> per token: n_shots
exemplars sampled without replacement, the zero-shot top-k, :func:`mozo_step` on the sampled
rows, advance every row with the chosen token -> stop at EOS or T_max. Each answer is charged
first (one query of the context's ``max_queries``) and refunded if the engine fails.

Offline (Algorithm 3): :func:`synthesize` runs the online pipeline once per public input,
charging one query each, and stores the (input, DP output) pairs as a new context with the
``public`` mechanism, which :func:`run_public` serves as ordinary few-shot ICL at no further
privacy cost (post-processing of DP outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from dpicl.domain import PublicSettings
from dpicl.engines.base import Engine, Exemplar, GenerationParams, PromptSpec
from dpicl.errors import BudgetExhausted, InvalidRequest
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


@dataclass(frozen=True, slots=True)
class SynthesisOutcome:
    source: StoredContext
    derived: StoredContext
    outputs: list[str]
    cost: Cost
    budget: BudgetStatus


async def synthesize(
    context: StoredContext,
    inputs: Sequence[str],
    *,
    engine: Engine,
    ledger: Ledger,
    repo: ContextRepository,
    rng: np.random.Generator,
    name: str | None = None,
) -> SynthesisOutcome:
    """Algorithm 3: DP outputs for public ``inputs``, stored as a new ``public`` context.

    Refuses up front (charging nothing) when the inputs do not fit the queries left. A
    concurrent query can still take the last ones meanwhile; then the charge of the input
    that no longer fits is refused like any other query.
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
    for text in inputs:
        out = await run_mozo(current, text, engine=engine, ledger=ledger, rng=rng)
        outputs.append(out.text.strip())
        current = out.context
    mech = PublicSettings(
        max_tokens=int(context.mechanism["max_tokens"]), derived_from=context.id
    ).model_dump()
    row = ContextRow(
        id=new_context_id(),
        name=name if name is not None else f"{context.name or context.id} (synthetic)",
        task="generation",
        labels=[],
        exemplars=[{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)],
        template=context.template,
        mechanism=mech,
        budget=None,
        mu2_spent=0.0,
        mu2_max=None,
        queries=0,
        max_queries=None,
    )
    derived = await repo.add(row)
    cost = cost_of(context)
    return SynthesisOutcome(
        source=current,
        derived=derived,
        outputs=outputs,
        cost=cost,
        budget=Ledger.status(current, cost),
    )


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
