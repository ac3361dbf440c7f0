"""Noise without the Gaussian's tails, seen black-box at the default plan (issue 35).

Private voting with two labels releases label A exactly when ``(h_A - h_B) + (N_A - N_B) > 0``
(docs/auditing.md, "The pivotal canary"). In a context of T partitions every partition votes
one of the two labels, so ``|h_A - h_B| <= T`` *whatever the engine votes*, and under the
Gaussian noise the server claims each label is released with probability at least

    r = Phi(-T / (sigma sqrt 2))            (:func:`least_release_rate`)

on any engine, a real model included. A noise of the claimed variance whose tails are bounded
(uniform: ``|N_A - N_B| <= 2 sqrt(3) sigma``) never releases the label all T partitions vote
against once ``T > 2 sqrt(3) sigma``; the pivotal design of the trials puts the release rates
mid-range, where such a noise is all but indistinguishable (issue 27's earlier set: flagged 0
times in 5 at the defaults, only by ``--profile verify``'s 3,000-trial companion).

So after the trials :func:`probe_tails` asks fresh contexts of paper 000's C0 (T partitions of
one exemplar, none holding the queried text: clean votes [0, T] on the simulator) at an
epsilon whose reported sigma puts ``2 sqrt(3) sigma`` just below T (:func:`tail_sigma`: r about
0.68%, nearly the most this test can have, 0.72%), the audit query, in rounds, until both
labels have come back. An honest server does after about ``1 / r`` answers (about 150); a
label never released in ``n`` answers, where ``2 (1 - r)^n <= ALPHA`` (:func:`answers_needed`,
about 1,460), is NONCONFORMING (exit 4): the noise lacks the tails it claims. Stopping early
stops only on a release, so the flag's event is "a label absent from n answers", whose
probability under the claim is at most ``ALPHA`` exactly (Bonferroni over the two labels), on
any engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable

from scipy import special

from dpicl_audit.claims import sigma_of
from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.context_info import context_info
from dpicl_audit.errors import TargetError, TargetRejected
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.probes.sections import TailsSection

__all__ = [
    "ALPHA",
    "BOUND",
    "PARTITIONS",
    "ROUND",
    "START_EPSILON",
    "answers_needed",
    "least_release_rate",
    "probe",
    "probe_tails",
    "tail_sigma",
]

#: Error of the test: an honest server is flagged in at most this share of runs, exactly.
ALPHA = 1e-4
#: T: at epsilon 8 the classical sigma (0.86) puts the uniform's reach, 2.97, just below 3.
PARTITIONS = 3
#: The first epsilon tried (the classical calibration's sigma there is 0.86: 2 sqrt 3 sigma
#: = 2.98 < 3).
START_EPSILON = 8.0
#: The largest |N_A - N_B| a noise of variance sigma^2 with bounded tails reaches, in sigmas:
#: the uniform's (half-width sigma sqrt 3 per count).
BOUND = 2.0 * math.sqrt(3.0)
#: Accept a reported sigma that leaves this share of T between the uniform's bound and T (a
#: sigma much smaller than T / BOUND makes r, and the test's power per answer, small).
_SLACK = (0.90, 0.995)
#: Requests in flight per round; tries at finding the epsilon; most answers one context is
#: budgeted for.
ROUND = 16
_TRIES = 4
_MOST_ANSWERS = 2000

#: Makes (body, query) of a C0 context of ``partitions`` at ``epsilon`` budgeted for
#: ``answers`` answers; None where no budget within the server's limit holds them.
MakeBody = Callable[[float, int, int], tuple[ContextBody, str] | None]


def least_release_rate(partitions: int, sigma: float) -> float:
    """The least probability with which Gaussian noise of ``sigma`` releases either of two
    labels over ``partitions`` votes: ``Phi(-T / (sigma sqrt 2))`` (module docstring)."""
    return float(special.ndtr(-partitions / (sigma * math.sqrt(2.0))))


def answers_needed(rate: float, alpha: float = ALPHA, labels: int = 2) -> int:
    """The answers after which a label never released rejects the claim at ``alpha``:
    the least n with ``labels (1 - rate)^n <= alpha``."""
    if not 0.0 < rate < 1.0:
        raise ValueError(f"rate must be in (0, 1), got {rate!r}")
    return math.ceil(math.log(alpha / labels) / math.log1p(-rate))


def tail_sigma(partitions: int, sigma: float) -> bool:
    """Whether ``sigma`` suits the probe at ``partitions``: the bounded noise's reach
    ``BOUND sigma`` between 90% and 99.5% of T."""
    reach = BOUND * sigma / partitions
    return _SLACK[0] <= reach <= _SLACK[1]


async def _context(
    target: AuditTarget, make: MakeBody, capacity: Callable[[float], int]
) -> tuple[str, str, float, float, int] | str:
    """A C0 context whose sigma suits the probe: (id, query, epsilon, sigma, the answers its
    budget holds), or why there is none. Sigma is close to proportional to 1 / epsilon for
    every calibration, so each try rescales the epsilon towards the sigma wanted."""
    epsilon, sigma = START_EPSILON, math.nan
    want = math.sqrt(_SLACK[0] * _SLACK[1]) * PARTITIONS / BOUND
    for _ in range(_TRIES):
        holds = min(capacity(epsilon), _MOST_ANSWERS)
        made = make(epsilon, PARTITIONS, holds) if holds > 0 else None
        if made is None:
            return f"no budget within the server's limit holds an answer at epsilon {epsilon:g}"
        try:
            info = context_info(await target.create_context(made[0]))
        except TargetRejected as exc:  # e.g. an epsilon above the server's limit
            return f"the server refused the probe's context at epsilon {epsilon:g}: {exc.message}"
        cid = info["id"]
        sigma = sigma_of(info)
        if tail_sigma(PARTITIONS, sigma):
            return cid, made[1], epsilon, sigma, holds
        with contextlib.suppress(TargetError):
            await target.delete_context(cid)
        epsilon *= sigma / want
    return f"no epsilon found whose reported sigma is about {want:.3g} (last {sigma:.3g})"


async def probe_tails(
    target: AuditTarget,
    make: MakeBody,
    labels: tuple[str, str],
    *,
    capacity: Callable[[float], int],
) -> TailsSection:
    """The probe of the module docstring. ``make`` builds the contexts, ``labels`` are their
    two labels, ``capacity(epsilon)`` is the most answers one budget holds at ``epsilon``."""
    found = await _context(target, make, capacity)
    if isinstance(found, str):
        return {"status": "unchecked", "message": found}
    cid, query, epsilon, sigma, held = found
    rate = least_release_rate(PARTITIONS, sigma)
    needed = answers_needed(rate)
    counts = dict.fromkeys(labels, 0)
    other: dict[str, int] = {}
    asked = 0
    refusal = ""
    try:
        while asked < needed and not all(counts.values()) and not other:
            try:
                if held == 0:  # the context's budget is spent: the next one
                    holds = min(capacity(epsilon), needed - asked)
                    made = make(epsilon, PARTITIONS, holds)
                    if made is None:
                        refusal = f"no budget within the server's limit at epsilon {epsilon:g}"
                        break
                    cid, held = str((await target.create_context(made[0]))["id"]), holds
                n = min(ROUND, held, needed - asked)
                outs = await asyncio.gather(*(target.classify(cid, query) for _ in range(n)))
            except TargetRejected as exc:
                refusal = f"refused after {asked} answers: {exc}"
                break
            for out in outs:
                label = str(out["label"])
                if label in counts:
                    counts[label] += 1
                else:
                    other[label] = other.get(label, 0) + 1
            asked, held = asked + n, held - n
            if held == 0:
                with contextlib.suppress(TargetError):
                    await target.delete_context(cid)
    finally:
        if held:
            with contextlib.suppress(TargetError):
                await target.delete_context(cid)
    return _judge(epsilon, sigma, rate, needed, asked, counts, other, refusal)


async def probe(target: AuditTarget, kit: Ingredients) -> TailsSection | None:
    """The probe on the contexts the mechanism makes for it (:attr:`Ingredients.
    tail_contexts`: a noisy argmax over two labels whose tails its claim states)."""
    if kit.tail_contexts is None or kit.capacity is None:
        return None
    made = await asyncio.to_thread(kit.tail_contexts)  # e.g. a dataset read from disk
    return await probe_tails(target, made.make, made.labels, capacity=kit.capacity)


def _judge(
    epsilon: float,
    sigma: float,
    rate: float,
    needed: int,
    asked: int,
    counts: dict[str, int],
    other: dict[str, int],
    refusal: str,
) -> TailsSection:
    """The section: NONCONFORMING where a label never came back in ``needed`` answers."""
    released = counts | other
    out: TailsSection = {
        "status": "ok",
        "message": "",
        "epsilon": epsilon,
        "sigma": sigma,
        "partitions": PARTITIONS,
        "least_rate": rate,
        "answers_needed": needed,
        "answers": asked,
        "labels": released,
    }
    shown = ", ".join(f"{lab!r} {n}" for lab, n in released.items())
    if other:
        out["status"] = "unchecked"
        out["message"] = f"labels outside the context's came back ({shown})"
    elif all(counts.values()):
        out["message"] = (
            f"both labels released within {asked} answers at sigma {sigma:.3g} over "
            f"{PARTITIONS} partitions ({shown}): the noise reaches the tails it claims"
        )
    elif asked < needed:
        out["status"] = "unchecked"
        out["message"] = f"stopped before {needed} answers: {refusal}"
    else:
        absent = next(lab for lab, n in counts.items() if n == 0)
        p = min(1.0, len(counts) * (1.0 - rate) ** asked)
        out["status"], out["p_value"] = "nonconforming", p
        out["message"] = (
            f"NONCONFORMING: {absent!r} never released in {asked} answers over {PARTITIONS} "
            f"partitions at sigma {sigma:.3g}, where Gaussian noise releases each label with "
            f"probability at least {rate:.3g} on any engine (p = {p:.2g} <= {ALPHA:g}): the "
            f"noise lacks the Gaussian's tails (bounded noise of the claimed variance reaches "
            f"only {BOUND * sigma:.3g} < {PARTITIONS})"
        )
    return out
