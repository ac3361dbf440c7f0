"""Positive controls of issue 35: bugs of the kinds a deployed API's surfaces invite.

Each fault is a :class:`tests.e2e.broken_realistic_server.Fault` (``patches``: the (module,
attribute, replacement) triples it installs, for ``monkeypatch``; ``install()`` and
``WARNING`` for ``python -m tests.servers tests.e2e.broken_surface_server:NAME PORT``).

* ``WEAK_CALIBRATION``: private voting's sigma is the paper's classical formula alone,
  without the guard that raises it to the analytic sigma where the formula breaks (epsilon
  above about 8 at delta 1e-5): at epsilon 16 the noise it reports has an exact epsilon of
  18.9. Everything it reports is the truth (sigma, its exact epsilon, the ledger's charges by
  that sigma); only the claim is broken.
* ``RACY_LEDGER``: the ledger checks the budget, lets the model run, then charges without
  checking again (the charge's own condition dropped): one request at a time it refuses
  exactly when it should; many in flight at once are all admitted on one check.
* ``LEAKY_FIELD``: ``/v1/classify`` answers carry an extra field ``confidence``: the
  un-noised vote share of the first label (a "helpful" score added by a gateway, computed
  from the clean votes). The label itself is honestly private; the field is not. Install it
  with :func:`leaky_app` around the app (an ASGI wrapper) plus its patch.
* ``MOZO_ONE_TOKEN``: DPS-MOZO's eps0 is calibrated for one token per answer (``queries``
  tokens) instead of ``queries x max_tokens`` (the composition over an answer's tokens
  forgotten); the record still reports ``max_tokens`` and ``tokens`` as configured. Every
  answer is a true DPS-MOZO answer at that eps0; only the claim over the context is broken.
* ``PROMPT_TOKENS``: the OpenAI routes' ``usage.prompt_tokens`` (0 by design: dpicl does not
  count them) estimates the prompt's tokens from its characters, exemplars included (a
  "complete" usage block): neighbouring contexts whose differing exemplar has another length
  answer with another count, streamed or not.
* ``CONTEXT_VERSION``: every answer, on every route, carries a header
  ``X-DPICL-Context-Version``, a short hash of the context's exemplars (for a cache in front
  of the server): it names which of the neighbouring contexts answered. Install it with
  :func:`version_app` around the app plus its patch.
* ``MOZO_NO_TOKEN_LIMIT``: DPS-MOZO's request limit not enforced: ``max_tokens`` above the
  context's calibrated ``T_max`` is answered with every token asked for (the calibration
  assumed at most ``T_max`` per answer), on every route.
* ``RACY_QUERIES``: ``RACY_LEDGER`` for a context limited by its answers (DPS-MOZO's
  ``queries``): the check reads the queries left, the model runs, the charge's own query
  condition is dropped; one at a time it refuses when it should, a burst overspends.
* ``MOZO_UNMIXED_FIRST``: DPS-MOZO's per-token constraint skipped on one token of each answer:
  the first token is drawn from the product of the raw one-shot distributions (lambda 1,
  the private distribution unmixed); every other token is an honest proven-mode token. The
  server reports everything as calibrated (eps0, per_token_epsilon, the claim) and its
  ``log_ratios`` clipped to eps0. ``MOZO_UNMIXED_RANDOM``: the same at one position drawn
  uniformly among the answer's ``max_tokens`` positions.
* ``TEMPERATURE_NOISE``: the voting noise is scaled by the ``temperature`` a chat client
  sends (none: the noise as calibrated); at ``temperature: 0`` the clean majority label comes
  back every time. Install it with :func:`temperature_app` around the app plus its patch.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import replace
from typing import Any

import numpy as np
from sqlalchemy import bindparam, update

import dpicl.api.openai.serving as serving_mod
import dpicl.api.openai.streaming as streaming_mod
import dpicl.api.routes.queries as queries_mod
import dpicl.mechanisms.dps_mozo.mechanism as mozo_mechanism
import dpicl.mechanisms.dps_mozo.pipeline as mozo_pipeline
import dpicl.mechanisms.dps_mozo.release as mozo_release
import dpicl.mechanisms.partitioned as partitioned_mod
import dpicl.mechanisms.voting.pipeline as voting_pipeline
import dpicl.privacy.ledger as ledger_mod
import dpicl.serving.answers as answers_mod
import dpicl.store.charges as charges_mod
import dpicl.store.repository as repository_mod
from dpicl.privacy.calibration import classic_sigma, sigma_for
from tests.e2e.broken_realistic_server import Fault

_honest_sigma_for = sigma_for


def classic_only_sigma(
    epsilon: float, delta: float, sensitivity: float, calibration: Any = "classic"
) -> float:
    """The classical sigma without the analytic guard (the analytic one when asked for)."""
    if calibration == "classic":
        return classic_sigma(epsilon, delta, sensitivity)
    return _honest_sigma_for(epsilon, delta, sensitivity, calibration)


WEAK_CALIBRATION = Fault(
    ((partitioned_mod, "sigma_for", classic_only_sigma),),
    "the classical sigma without its guard: weaker than claimed above epsilon 8",
)

_honest_charge = ledger_mod.Ledger.charge


class _Unchecked:
    """The repository, its charges made with no budget condition (an unbounded slack)."""

    def __init__(self, repo: Any) -> None:
        self._repo = repo

    def __getattr__(self, name: str) -> Any:
        return getattr(self._repo, name)

    def charge_request(self, *args: Any, **kwargs: Any) -> Any:
        return replace(self._repo.charge_request(*args, **kwargs), slack=1e300)


async def racy_charge(self: Any, context: Any, cost: Any) -> Any:
    """Check, await (the model runs), then charge unconditionally."""
    fresh = await self._repo.get(context.id) or context
    left = ledger_mod.Ledger.status(fresh, cost).remaining_queries
    if left is not None and left < 1:
        return await _honest_charge(self, context, cost)  # refused, as it should be
    await asyncio.sleep(0.05)
    unchecked = ledger_mod.Ledger(_Unchecked(self._repo), self.principal, _pending=self._state)  # type: ignore[arg-type]
    return await _honest_charge(unchecked, context, cost)


RACY_LEDGER = Fault(
    ((ledger_mod.Ledger, "charge", racy_charge),),
    "the ledger's check and charge are two steps: concurrent requests overspend the budget",
)

_CTX = charges_mod._CTX
#: The context's charge without its query condition (the budget's condition kept).
CHARGE_WITHOUT_QUERY_LIMIT = (
    update(_CTX)
    .where(
        _CTX.c.id == bindparam("cid"),
        _CTX.c.mu2_max.is_(None)
        | (_CTX.c.mu2_spent + charges_mod._MU2 <= _CTX.c.mu2_max * bindparam("slack")),
    )
    .values(mu2_spent=_CTX.c.mu2_spent + charges_mod._MU2, queries=_CTX.c.queries + 1)
    .returning(_CTX.c.mu2_spent, _CTX.c.queries)
)


class _NoQueryLimit(charges_mod.ChargeStatements):
    """The repository's statements, its context charge without the query condition."""

    def __init__(self, backend: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(backend, CHARGE_WITHOUT_QUERY_LIMIT, charges_mod.REFUND, **kwargs)


RACY_QUERIES = Fault(
    (
        (ledger_mod.Ledger, "charge", racy_charge),
        (repository_mod, "ChargeStatements", _NoQueryLimit),
    ),
    "a query limit checked before the answer and not when charged: bursts overspend it",
)

_honest_classify_body = queries_mod.classify_body
#: The request's holder of the clean share (set by the ASGI wrapper, filled by the route).
_LEAK: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "leak", default=None
)


def leaky_classify_body(out: Any, engine: str) -> dict[str, object]:
    """The honest body; the clean vote share of the first label noted for the wrapper."""
    holder = _LEAK.get()
    clean = getattr(getattr(out, "release", None), "clean_counts", None)
    if holder is not None and clean is not None and float(sum(clean)) > 0:
        holder["confidence"] = float(clean[0]) / float(sum(clean))
    return _honest_classify_body(out, engine)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def leaky_app(app: Any) -> Any:
    """``app`` with ``confidence`` added to every ``/v1/classify`` answer's JSON."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != "/v1/classify":
            await app(scope, receive, send)
            return
        holder: dict[str, float] = {}
        token = _LEAK.set(holder)
        start: MutableMapping[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(chunks)
            if start.get("status") == 200 and "confidence" in holder:
                data = json.loads(body)
                data["confidence"] = holder["confidence"]
                body = json.dumps(data).encode()
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        try:
            await app(scope, receive, capture)
        finally:
            _LEAK.reset(token)

    return wrapped


_TEMPERATURE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "temperature", default=None
)
_honest_private_vote = voting_pipeline.private_vote  # type: ignore[attr-defined]


def temperature_scaled_vote(scores: Any, sigma: float, temperature: float, rng: Any) -> Any:
    """Honest voting with the noise scaled by the chat client's temperature, where sent."""
    scale = _TEMPERATURE.get()
    noise = sigma if scale is None else max(sigma * scale, 1e-12)
    return _honest_private_vote(scores, noise, temperature, rng)


def temperature_app(app: Any, paths: tuple[str, ...] = ("/v1/chat/completions",)) -> Any:
    """``app`` with the ``temperature`` of a request to one of ``paths`` (the chat route by
    default) handed to the voting noise."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") not in paths:
            await app(scope, receive, send)
            return
        messages = []
        while True:
            message = await receive()
            messages.append(message)
            if not message.get("more_body"):
                break
        raw = b"".join(m.get("body", b"") for m in messages)
        given = None
        with contextlib.suppress(ValueError, AttributeError):
            given = json.loads(raw).get("temperature")
        token = _TEMPERATURE.set(float(given) if isinstance(given, int | float) else None)
        replay = iter(messages)

        async def again() -> MutableMapping[str, Any]:
            # The body replayed, then the client's own messages (a streamed answer listens
            # for the client's disconnect: one made up here would cut its stream short).
            replayed = next(replay, None)
            return replayed if replayed is not None else await receive()

        try:
            await app(scope, again, send)
        finally:
            _TEMPERATURE.reset(token)

    return wrapped


TEMPERATURE_NOISE = Fault(
    ((voting_pipeline, "private_vote", temperature_scaled_vote),),
    "voting noise is scaled by the chat client's temperature (install temperature_app too)",
)

LEAKY_FIELD = Fault(
    ((queries_mod, "classify_body", leaky_classify_body),),
    "answers carry the un-noised vote share in an extra field (install leaky_app too)",
)

_honest_calibrate_mozo = mozo_mechanism.calibrate_mozo


def one_token_calibrate_mozo(mech: Any, n_exemplars: int) -> Any:
    """eps0 for one token per answer; the record says the context's max_tokens and tokens."""
    if mech.guarantee != "proven" or mech.max_tokens == 1:
        return _honest_calibrate_mozo(mech, n_exemplars)
    out = _honest_calibrate_mozo(mech.model_copy(update={"max_tokens": 1}), n_exemplars)
    update = {"max_tokens": mech.max_tokens, "tokens": mech.queries * mech.max_tokens}
    # The record is a MozoCalibration since h38a (was a dict).
    return out.model_copy(update=update) if hasattr(out, "model_copy") else out | update


MOZO_ONE_TOKEN = Fault(
    ((mozo_mechanism, "calibrate_mozo", one_token_calibrate_mozo),),
    "DPS-MOZO's eps0 calibrated for one token per answer, not queries x max_tokens tokens",
)

_honest_usage_of = serving_mod.usage_of


def counted_usage_of(a: Any) -> Any:
    """The honest usage, with the prompt's tokens estimated (4 characters a token)."""
    chars = sum(len(i) + len(o) for i, o in a.context.exemplars) + len(a.context.template)
    usage = _honest_usage_of(a)
    return usage.model_copy(
        update={"prompt_tokens": chars // 4, "total_tokens": chars // 4 + usage.completion_tokens}
    )


PROMPT_TOKENS = Fault(
    (
        (serving_mod, "usage_of", counted_usage_of),
        (streaming_mod, "usage_of", counted_usage_of),
    ),
    "usage.prompt_tokens counts the prompt's characters, the private exemplars included",
)

_honest_load_context = answers_mod.load_context
#: The request's holder of the context's version (set by the ASGI wrapper, filled on load).
_VERSION: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "version", default=None
)


async def versioned_load_context(context_id: str, svc: Any, principal: Any, **kw: Any) -> Any:
    """The honest lookup; a hash of the context's exemplars noted for the wrapper."""
    ctx = await _honest_load_context(context_id, svc, principal, **kw)
    holder = _VERSION.get()
    if holder is not None and kw.get("for_query"):
        holder["version"] = hashlib.sha256(repr(ctx.exemplars).encode()).hexdigest()[:12]
    return ctx


def version_app(app: Any) -> Any:
    """``app`` with ``X-DPICL-Context-Version`` added to every answer's headers."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return
        holder: dict[str, str] = {}
        token = _VERSION.set(holder)

        async def tagged(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and "version" in holder:
                headers = [*message.get("headers", [])]
                headers.append((b"x-dpicl-context-version", holder["version"].encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await app(scope, receive, tagged)
        finally:
            _VERSION.reset(token)

    return wrapped


CONTEXT_VERSION = Fault(
    (
        (answers_mod, "load_context", versioned_load_context),
        (serving_mod, "load_context", versioned_load_context),
    ),
    "answers carry a hash of the context's exemplars in a header (install version_app too)",
)


def unlimited_max_tokens(cal: Any, max_tokens: int | None) -> int:
    """The client's max_tokens as asked; the context's T_max only where none is sent.
    ``cal`` is the context's ``MozoCalibration``, as the honest ``_max_tokens`` takes it
    (given the stored context instead, a request without max_tokens crashed with a 500)."""
    return int(cal.max_tokens) if max_tokens is None else max_tokens


MOZO_NO_TOKEN_LIMIT = Fault(
    ((mozo_pipeline, "_max_tokens", unlimited_max_tokens),),
    "DPS-MOZO answers max_tokens above the context's T_max with every token asked for",
)

_honest_mozo_step = mozo_release.mozo_step
_honest_mozo_decode = mozo_pipeline.mozo_decode
#: Per answer: the index of the next token and the index whose constraint is skipped.
_SKIP: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("skip", default=None)


def _skipping_decode(first: bool) -> Any:
    async def decode(*args: Any, max_tokens: int, **kwargs: Any) -> Any:
        """The honest decoding loop, one of its tokens marked to be drawn unmixed."""
        at = 0 if first else secrets.randbelow(max(int(max_tokens), 1))
        token = _SKIP.set([0, at])
        try:
            return await _honest_mozo_decode(*args, max_tokens=max_tokens, **kwargs)
        finally:
            _SKIP.reset(token)

    return decode


def unmixed_mozo_step(*args: Any, eps0: float | None = None, **kwargs: Any) -> Any:
    """The honest step, except at the marked token: lambda 1 (the one-shot distributions
    themselves, no mixing with the zero-shot one), its log-ratios reported clipped to eps0."""
    state = _SKIP.get()
    if state is None or eps0 is None:  # the paper's mode and other callers: honest
        return _honest_mozo_step(*args, eps0=eps0, **kwargs)
    index, state[0] = state[0], state[0] + 1
    if index != state[1]:
        return _honest_mozo_step(*args, eps0=eps0, **kwargs)
    step = _honest_mozo_step(*args, eps0=1e300, **(kwargs | {"lam_max": 1.0}))
    return replace(step, log_ratios=np.minimum(step.log_ratios, eps0))


MOZO_UNMIXED_FIRST = Fault(
    (
        (mozo_pipeline, "mozo_decode", _skipping_decode(first=True)),
        (mozo_pipeline, "mozo_step", unmixed_mozo_step),
    ),
    "DPS-MOZO's first token of each answer drawn unmixed (its eps0 constraint skipped)",
)

MOZO_UNMIXED_RANDOM = Fault(
    (
        (mozo_pipeline, "mozo_decode", _skipping_decode(first=False)),
        (mozo_pipeline, "mozo_step", unmixed_mozo_step),
    ),
    "DPS-MOZO's token at one random position of each answer drawn unmixed",
)

FAULTS = {
    "mozo_unmixed_first": MOZO_UNMIXED_FIRST,
    "mozo_unmixed_random": MOZO_UNMIXED_RANDOM,
    "racy_queries": RACY_QUERIES,
    "mozo_no_token_limit": MOZO_NO_TOKEN_LIMIT,
    "prompt_tokens": PROMPT_TOKENS,
    "context_version": CONTEXT_VERSION,
    "mozo_one_token": MOZO_ONE_TOKEN,
    "weak_calibration": WEAK_CALIBRATION,
    "racy_ledger": RACY_LEDGER,
    "leaky_field": LEAKY_FIELD,
    "temperature_noise": TEMPERATURE_NOISE,
}
