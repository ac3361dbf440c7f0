"""DPS-MOZO (paper 004, Algorithms 1-2) online, as a request pipeline.

Online (Algorithm 2): query -> |D| one-shot prompts + the zero-shot prompt, opened as ONE
decoding session (the KV cache holds every exemplar's prompt once) -> per token: n_shots
exemplars sampled without replacement, the zero-shot top-k, :func:`mozo_step` on the sampled
rows, advance every row with the chosen token -> stop at EOS or T_max. Each answer is charged
first (one query of the context's ``max_queries``) and refunded if the engine fails.

The offline mode (Algorithm 3) is :mod:`dpicl.mechanisms.dps_mozo.offline`. The
:class:`~dpicl.mechanisms.base.TokenSink` it streams to is defined beside the protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpicl.engines.base import Engine, PromptSpec
from dpicl.errors import InvalidRequest
from dpicl.mechanisms.base import TokenSink
from dpicl.mechanisms.dps_mozo.accounting import MozoCalibration, mozo_cost
from dpicl.mechanisms.dps_mozo.diagnostics import exact_shot_divergence, exact_shot_log_ratio
from dpicl.mechanisms.dps_mozo.release import mixed_logits, mozo_step, sample_shots
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.pipelines.partitions import exemplars_of, zero_shot_prompt
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.prompts import render
from dpicl.store.repository import StoredContext

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

    @property
    def finish_reason(self) -> Literal["stop", "length"]:
        return "stop" if self.stopped_at_eos else "length"

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


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
    on_text: Callable[[str], Awaitable[None]] | None = None,
) -> _Decoded:
    """The decoding loop over one session; ``prompts[-1]`` is the zero-shot prompt.

    ``eps0`` given: the proven mode (max-log-ratio constraint); else the paper's at
    ``(beta, alpha)``.

    ``private=False`` is the non-private ensemble baseline of the benchmark: the same loop
    and the same sampled shots, but the token is drawn from the normalised product of the
    raw one-shot distributions (no lambda search, no mixing).

    ``on_text`` hears the text each sampled token adds, as it is sampled (held back while
    the decoded text ends in an incomplete character, since a token may carry part of one).
    """
    n_exemplars = len(prompts) - 1
    session = await engine.open_decoding(prompts, zero_shot_index=n_exemplars, top_k=top_k)
    token_ids: list[int] = []
    tokens: list[MozoToken] = []
    eos = False
    sent = ""
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
            if on_text is not None:
                sent = await _emit(session.decode(token_ids), sent, on_text, final=False)
            if t + 1 < max_tokens:
                await session.advance(token)
        text = session.decode(token_ids)
        if on_text is not None:
            await _emit(text, sent, on_text, final=True)
    finally:
        await session.aclose()
    return _Decoded(token_ids=token_ids, tokens=tokens, text=text, eos=eos)


async def _emit(
    now: str, sent: str, on_text: Callable[[str], Awaitable[None]], *, final: bool
) -> str:
    """Send what ``now`` adds to the text already ``sent``; return the text sent so far.

    Only an extension of what was sent can be sent (a tokenizer that rewrites earlier text
    when more follows, e.g. cleaning up spaces, sends the rest once it extends again)."""
    if not now.startswith(sent) or len(now) == len(sent):
        return sent
    if not final and now.endswith("\ufffd"):
        return sent  # the token ended inside a multi-byte character
    await on_text(now[len(sent) :])
    return now


def _max_tokens(cal: MozoCalibration, max_tokens: int | None) -> int:
    t_max = cal.max_tokens
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
    sink: TokenSink | None = None,
) -> MozoOutcome:
    """One DPS-MOZO answer: charged one query first, refunded if the engine fails before
    any token left. ``sink`` given: the answer is streamed to it as it is sampled."""
    cal = context.record_as(MozoCalibration)
    tokens = _max_tokens(cal, max_tokens)
    cost = mozo_cost(cal)
    beta, alpha = (None, None) if cal.proven else cal.paper_order()
    streamed = False

    async def on_text(delta: str) -> None:
        nonlocal streamed
        streamed = True
        assert sink is not None
        await sink.text(delta)

    async def on_charged(charged: StoredContext) -> None:
        assert sink is not None
        await sink.charged(cost, Ledger.status(charged, cost))

    charged, out = await paid_engine_call(
        ledger,
        context,
        cost,
        engine.name,
        mozo_decode(
            engine,
            mozo_prompts(context, query),
            n_shots=cal.n_shots,
            top_k=cal.top_k,
            max_tokens=tokens,
            beta=beta,
            alpha=alpha,
            lam_max=cal.lambda_max,
            rng=rng,
            eps0=cal.eps0() if cal.proven else None,
            exact=exact,
            on_text=on_text if sink is not None else None,
        ),
        on_charged=on_charged if sink is not None else None,
        released=lambda: streamed,
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
