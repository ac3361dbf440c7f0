"""Positive controls of issue 44: channels beside the answer that carry the private votes.

Each fault is a :class:`tests.e2e.broken_realistic_server.Fault` (``patches``: the (module,
attribute, replacement) triples it installs, for ``monkeypatch``; ``install()`` and
``WARNING`` for ``python -m tests.servers tests.e2e.broken_channel_server:NAME PORT``).

* ``REFUSE_CLOSE``: a private vote whose clean histogram is close (the top two labels at
  most :data:`CLOSE` votes apart) is refused, one time in two, with a 422 ``low_confidence``
  ("the query is ambiguous"), after the charge, as a "quality gate" in front of the
  release would. Whether a query is answered then depends on the private votes. On the
  audit's pivotal design the worlds' clean votes are [3, 1] and [2, 2]: C0's queries are
  refused half the time, C1's never.
* ``SLOW_CLOSE``: a private vote whose clean histogram is close takes :data:`DELAY_S` longer
  (a "second opinion" pass): on the pivotal design C0 answers about 20 times slower than C1
  on the oracle engine. Both worlds' answers are honest releases.
* ``SLOW_CLOSE_STREAM``: as ``SLOW_CLOSE``, :data:`STREAM_DELAY_S`, but on streamed answers
  only (the first token comes later), which the trials (never streamed) cannot see; the
  surface probe's streams time their first token (issue 44).
* ``REFUSE_LONG_PRIVATE`` (issue 44, item 3): a partition prompt longer than
  :data:`PROMPT_CHARS` characters is refused, before the charge (free), with a 422 whose
  message names the partition and its length, as a server that checks each prompt against
  its model's window would. No query reaches the limit alone (the query limit, 8,000, plus
  the template and short exemplars stay below it); only a long private exemplar pushes a
  partition over it, so the refusal and its message tell the worlds apart. The trials' short
  canary never reaches it: only the limits probe (``dpicl_audit.probes.limits``) sees it.

Two that answer more than the documented surface (issue 44, item 4):

* ``DEBUG_QUERY_PARAM``: ``/v1/chat/completions?debug=1`` answers with an extra body field
  ``debug.clean_votes``, the clean vote histogram (a debug view left switched on in
  production). Plain requests, the trials', are honest.
* ``SEED_REACHES_NOISE``: the OpenAI routes accept ``seed`` (instead of refusing it) and seed
  the voting noise's generator with it: the same seed answers the same label every time.
  Requests without a seed, the trials', are honest.

And one that is not a leak, for the auditor's error path: ``REFUSE_RANDOM`` refuses one query
in ten at random (422 ``low_confidence``) whatever the votes: the refusals are named, the
figures read the answered trials, and the run exits 1 (it could not ask what it planned).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import secrets
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse

import dpicl.api.openai.protocol as protocol_mod
import dpicl.api.openai.router as router_mod
import dpicl.api.openai.streaming as streaming
import dpicl.mechanisms.esa.pipeline as esa_pipeline
import dpicl.mechanisms.voting.mechanism as voting_mechanism
import dpicl.mechanisms.voting.pipeline as voting_pipeline
from dpicl.engines.base import PromptSpec
from dpicl.errors import DpiclError, InvalidRequest
from tests.e2e.broken_realistic_server import Fault

#: Votes apart (top label against the next) at or below which a histogram is "close".
CLOSE = 1
#: The extra seconds of a close vote under ``SLOW_CLOSE``.
DELAY_S = 0.05

#: The partition prompt's length (characters) above which ``REFUSE_LONG_PRIVATE`` refuses:
#: twice the default query limit, so that no query alone reaches it.
PROMPT_CHARS = 16_384

#: The extra seconds of a close vote's first streamed token under ``SLOW_CLOSE_STREAM``.
STREAM_DELAY_S = 0.25

_honest_run_voting = voting_mechanism.run_voting
_honest_stream_answer = streaming.answer
#: Set while a streamed answer is computed (``SLOW_CLOSE_STREAM``).
_STREAMED: contextvars.ContextVar[bool] = contextvars.ContextVar("streamed", default=False)
_honest_partition_prompts = voting_pipeline.partition_prompts


class LowConfidence(DpiclError):
    """The fault's refusal (not a dpicl error: a wrapper's)."""

    status_code = 422
    code = "low_confidence"


def _close(outcome: Any) -> bool:
    clean = np.sort(np.asarray(outcome.release.clean_counts, dtype=np.float64))[::-1]
    return clean.size < 2 or float(clean[0] - clean[1]) <= CLOSE


async def refusing_run_voting(*args: Any, **kwargs: Any) -> Any:
    """Honest voting; a close vote refused one time in two (after the charge)."""
    outcome = await _honest_run_voting(*args, **kwargs)
    if _close(outcome) and secrets.randbelow(2):
        raise LowConfidence("the query is ambiguous for this context; rephrase it")
    return outcome


async def slow_run_voting(*args: Any, **kwargs: Any) -> Any:
    """Honest voting; a close vote answered :data:`DELAY_S` later."""
    outcome = await _honest_run_voting(*args, **kwargs)
    if _close(outcome):
        await asyncio.sleep(DELAY_S)
    return outcome


async def marked_stream_answer(*args: Any, **kwargs: Any) -> Any:
    """The streaming route's honest answer, marked as streamed for the voting below (the
    route computes it in a task of its own, which keeps this context)."""
    _STREAMED.set(True)
    return await _honest_stream_answer(*args, **kwargs)


async def slow_streamed_run_voting(*args: Any, **kwargs: Any) -> Any:
    """Honest voting; a close vote of a streamed answer :data:`STREAM_DELAY_S` later."""
    outcome = await _honest_run_voting(*args, **kwargs)
    if _STREAMED.get() and _close(outcome):
        await asyncio.sleep(STREAM_DELAY_S)
    return outcome


async def randomly_refusing_run_voting(*args: Any, **kwargs: Any) -> Any:
    """Honest voting; one query in ten refused whatever the votes."""
    outcome = await _honest_run_voting(*args, **kwargs)
    if secrets.randbelow(10) == 0:
        raise LowConfidence("the query could not be answered now; try again")
    return outcome


def length_checked_partition_prompts(context: Any, query: str) -> list[PromptSpec]:
    """The honest prompts, refused (before the charge) where one is over :data:`PROMPT_CHARS`
    characters, the message naming its partition and length: the leak of issue 44, item 3."""
    prompts: list[PromptSpec] = _honest_partition_prompts(context, query)
    for t, p in enumerate(prompts):
        if len(p.text) > PROMPT_CHARS:
            raise InvalidRequest(
                f"the prompt of partition {t} has {len(p.text)} characters; the model "
                f"accepts {PROMPT_CHARS}",
                param="query",
            )
    return prompts


REFUSE_CLOSE = Fault(
    ((voting_mechanism, "run_voting", refusing_run_voting),),
    "a close private vote is refused (422 low_confidence) one time in two",
)
SLOW_CLOSE = Fault(
    ((voting_mechanism, "run_voting", slow_run_voting),),
    f"a close private vote takes {DELAY_S * 1e3:g} ms longer",
)
SLOW_CLOSE_STREAM = Fault(
    (
        (streaming, "answer", marked_stream_answer),
        (voting_mechanism, "run_voting", slow_streamed_run_voting),
    ),
    f"a close private vote's streamed first token comes {STREAM_DELAY_S * 1e3:g} ms later",
)
REFUSE_LONG_PRIVATE = Fault(
    (
        (voting_pipeline, "partition_prompts", length_checked_partition_prompts),
        (esa_pipeline, "partition_prompts", length_checked_partition_prompts),
    ),
    f"a partition prompt over {PROMPT_CHARS} characters refused for free (422 naming its length)",
)

REFUSE_RANDOM = Fault(
    ((voting_mechanism, "run_voting", randomly_refusing_run_voting),),
    "one query in ten refused (422 low_confidence) whatever the votes (not a leak)",
)

#: The request's debug holder (``?debug=1`` on the chat route), filled by the vote.
_DEBUG: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "debug", default=None
)
_honest_complete = router_mod._complete


async def debug_complete(req: Any, svc: Any, caller: Any, request: Any) -> Any:
    """The honest OpenAI answer; on the chat route with ``?debug=1``, the clean votes added."""
    if req.kind != "chat" or request.query_params.get("debug") != "1":
        return await _honest_complete(req, svc, caller, request)
    holder: dict[str, Any] = {}
    token = _DEBUG.set(holder)
    try:
        response = await _honest_complete(req, svc, caller, request)
    finally:
        _DEBUG.reset(token)
    if not isinstance(response, JSONResponse) or "clean_votes" not in holder:
        return response
    body = json.loads(bytes(response.body)) | {"debug": {"clean_votes": holder["clean_votes"]}}
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}
    return JSONResponse(body, status_code=response.status_code, headers=headers)


async def noting_run_voting(*args: Any, **kwargs: Any) -> Any:
    """Honest voting; the clean votes noted where a debug request asks for them."""
    outcome = await _honest_run_voting(*args, **kwargs)
    holder = _DEBUG.get()
    if holder is not None:
        holder["clean_votes"] = [float(c) for c in outcome.release.clean_counts]
    return outcome


#: The OpenAI request's ``seed`` (set by its conversion to the native request).
_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("seed", default=None)
_honest_to_native = protocol_mod._Common.to_native
_honest_private_vote = voting_pipeline.private_vote  # type: ignore[attr-defined]


def seed_noting_to_native(self: Any, task: str, query: Any) -> Any:
    """The honest conversion; the request's seed noted for the vote."""
    _SEED.set(self.seed if isinstance(self.seed, int) else None)
    return _honest_to_native(self, task, query)


def seeded_private_vote(scores: Any, sigma: float, temperature: float, rng: Any) -> Any:
    """Honest voting, its generator seeded by the client's seed where one was sent."""
    seed = _SEED.get()
    return _honest_private_vote(
        scores, sigma, temperature, rng if seed is None else np.random.default_rng(seed)
    )


DEBUG_QUERY_PARAM = Fault(
    (
        (router_mod, "_complete", debug_complete),
        (voting_mechanism, "run_voting", noting_run_voting),
    ),
    "/v1/chat/completions?debug=1 answers with the clean votes (debug.clean_votes)",
)
SEED_REACHES_NOISE = Fault(
    (
        (protocol_mod, "REFUSED", tuple(p for p in protocol_mod.REFUSED if p != "seed")),
        (protocol_mod._Common, "to_native", seed_noting_to_native),
        (voting_pipeline, "private_vote", seeded_private_vote),
    ),
    "the OpenAI routes accept seed and seed the voting noise with it",
)

FAULTS = {
    "refuse_close": REFUSE_CLOSE,
    "slow_close": SLOW_CLOSE,
    "slow_close_stream": SLOW_CLOSE_STREAM,
    "refuse_long_private": REFUSE_LONG_PRIVATE,
    "refuse_random": REFUSE_RANDOM,
    "debug_query_param": DEBUG_QUERY_PARAM,
    "seed_reaches_noise": SEED_REACHES_NOISE,
}
