"""Vary what a client controls (issue 35, item 2): the sampling parameters a client sends,
on every answering route, must not change the release.

dpicl's OpenAI routes accept ``temperature`` and ``top_p`` and ignore them (the noise and the
votes are the context's); its native route refuses them (422, unknown field). A server may
also refuse them on any route. A server that lets them reach the noise (e.g. noise scaled by
the client's temperature: at ``temperature: 0`` the majority label comes back every time)
releases the un-noised answer to any client who asks. So, after the trials, a fresh context
of the run's C1 body at :data:`SWEEP_EPSILON` (or the plan's smallest epsilon, where that is
smaller; budgeted for the sweep) is asked the audit
query :data:`PER_VARIANT` times with each variant of :data:`VARIANTS`: on the chat route no
parameter, temperature 0, 1 and 2, top_p 0.1 and max_tokens 1; on the completions route no
parameter, temperature 0 and top_p 0.1; streamed (chat and completions) temperature 0; on
the native route temperature 0 (skipped through ``--api openai``, which has no native route).
A variant the server refuses (a 4xx) is fine. The labels of the answered variants must come
from one distribution, whatever the route: each variant's share of the pooled most common
label is tested against the other variants' (Fisher's exact test, two-sided), and so is
every pool of variants sending one parameter value (across routes) or sharing a route (issue
44: a leak on every route moves all its variants at once), Bonferroni-corrected over those
tests; p below :data:`ALPHA` (1e-4: a correct server is
flagged in at most 1 run in 10,000, exactly) is NONCONFORMING (exit 4) and names the variant.
The result is ``results["parameters"]``.

Beside those, every other parameter of the routes' schemas (issue 44, item 4;
:mod:`.client_schema`: the OpenAI SDK's request fields for chat and completions, and what the
server's ``/openapi.json`` declares for them and for ``/v1/classify``) is sent with each of its
values (:data:`~.client_schema.VALUES`) on each of those routes, :data:`PER_SCHEMA` answers a
variant (one, where the server refuses it). They join the same test, pooled as the others
are: one value across routes (a seed that fixes the noise answers one label whatever the
route), every value of one parameter, and each route; the ``no parameter`` pool is the test
of "any parameter against none".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from pydantic import JsonValue
from scipy import special

from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.errors import TargetError, TargetNotFound, TargetRejected
from dpicl_audit.estimators.composition import planned_queries
from dpicl_audit.jsontypes import JsonMapping
from dpicl_audit.probes.answers import read_answer
from dpicl_audit.probes.answers import request as surface_request
from dpicl_audit.probes.client_schema import (
    OWN_FIELDS,
    ROUTE_PATHS,
    declared,
    fetch_openapi,
    sdk_parameters,
    values_for,
)
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.probes.sections import ParametersSection, ParameterVariant

__all__ = [
    "ALPHA",
    "PER_SCHEMA",
    "PER_VARIANT",
    "SCREEN",
    "SWEEP_EPSILON",
    "VARIANTS",
    "Variant",
    "fisher_two_sided",
    "probe",
    "schema_variants",
    "shown",
    "sweep_parameters",
]

#: Error of the homogeneity test (a correct server is flagged in at most this share of runs).
ALPHA = 1e-4
#: Answers asked per variant of :data:`VARIANTS`.
PER_VARIANT = 30
#: Answers asked per variant of the schema's other parameters (:func:`schema_variants`):
#: fewer, for the cost (a default one-epsilon audit within 1.5 times issue 44's), pooled for
#: power. A seed that fixes the noise makes one value's 30 answers on chat and completions
#: one label: p about 0.52^30 = 3e-9 before Bonferroni, where the honest share is 0.52.
PER_SCHEMA = 15
#: Answers that screen a schema variant first (issue 44's cost: a default one-epsilon audit
#: within 1.5 times the one before the schema's parameters). Only a variant whose screening
#: answers are all one label is asked its :data:`PER_SCHEMA` answers, and only those are
#: tested: a parameter that fixes the release (a seed that seeds the noise) passes the screen
#: every time, an honest variant one time in 16 (2 x 0.52^5 at the honest share 0.52). The
#: screening answers stay out of the test: the answers tested are independent of the choice
#: of the variants tested under the null (its answers are i.i.d.), so Fisher's test stays
#: exact (a test of the screening answers too would be biased by the choice).
SCREEN = 5
#: The sweep's epsilon: the noisier the release, the further a parameter that removes the
#: noise moves it. Temperature-scaled noise on the chat path makes two variants (chat and
#: chat streamed, temperature 0) answer the majority 30 times in 30, which also raises the
#: pool they are compared with. At the default plan's first epsilon (1; the pivotal C1's
#: honest share Phi(2 / (sigma sqrt 2)) = 0.58 at sigma 6.85) the test missed 2 runs in 5
#: (p 1.4e-4 against ALPHA); at 0.25 (share 0.52) the expected p is 1.8e-6, 1.1e-5 with the
#: pool one standard deviation up.
SWEEP_EPSILON = 0.25
#: One variant: (its name, the route as probes.surface names it, the body's extra fields).
Variant = tuple[str, str, dict[str, JsonValue]]
#: The sampling parameters swept with :data:`PER_VARIANT` answers each. The first is the
#: reference the departing variant is named against.
VARIANTS: tuple[Variant, ...] = (
    ("chat, no parameter", "chat", {}),
    ("chat, temperature 0", "chat", {"temperature": 0}),
    ("chat, temperature 1", "chat", {"temperature": 1}),
    ("chat, temperature 2", "chat", {"temperature": 2}),
    ("chat, top_p 0.1", "chat", {"top_p": 0.1}),
    ("chat, max_tokens 1", "chat", {"max_tokens": 1}),
    ("completions, no parameter", "completions", {}),
    ("completions, temperature 0", "completions", {"temperature": 0}),
    ("completions, top_p 0.1", "completions", {"top_p": 0.1}),
    ("chat streamed, temperature 0", "chat-stream", {"temperature": 0}),
    ("completions streamed, temperature 0", "completions-stream", {"temperature": 0}),
    ("native, temperature 0", "native", {"temperature": 0}),
)
_CHAT = "/v1/chat/completions"


class _NoRoute(Exception):
    """The server has no such route (404/405 naming neither a context nor a model)."""


class _Refused(Exception):
    """A 4xx answer to a raw request: the server refused the variant."""


async def _ask(
    target: Any, route: str, cid: str, query: str, extra: Mapping[str, JsonValue]
) -> str:
    """One released label. Through a client that sends only JSON posts (``post``), the chat
    route alone; through one that sends raw requests (``send``), any route, streams read
    whole (probes.answers.read_answer)."""
    if not hasattr(target, "send"):
        body = {"model": cid, "messages": [{"role": "user", "content": query}], **extra}
        out = await target.post(_CHAT, body)
        return str(out["choices"][0]["message"]["content"])
    path, request = surface_request(route, "classification", cid, query, None)
    got = await target.send(path, request | dict(extra))
    if got.status_code in (404, 405) and "context" not in got.text and "model" not in got.text:
        raise _NoRoute(path)
    if got.status_code >= 400:
        raise _Refused(f"{path} answered {got.status_code}: {got.text[:200]}")
    return str(read_answer(route, got)["answer"])


def _variants(target: Any) -> tuple[Variant, ...]:
    """The variants this client can send: the chat route's through a JSON-only client, no
    native route through ``--api openai``."""
    if not hasattr(target, "send"):
        return tuple(v for v in VARIANTS if v[1] == "chat")
    if isinstance(target, OpenAIClient):
        return tuple(v for v in VARIANTS if v[1] != "native")
    return VARIANTS


def shown(value: JsonValue) -> str:
    """A sent value as a variant's name shows it (``0``, ``0.1``, ``{"type": "json_object"}``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}"
    return json.dumps(value, separators=(",", ":"))[:60]


def schema_variants(routes: tuple[str, ...], openapi: JsonMapping | None) -> tuple[Variant, ...]:
    """Every parameter of ``routes``' schemas (:mod:`.client_schema`) with each of its values,
    one variant a value and route, but those of :data:`VARIANTS` and the fields every request
    sends."""
    sdk = sdk_parameters()
    swept = {(route, name) for _, route, extra in VARIANTS for name in extra}
    out: list[Variant] = []
    for route in routes:
        schemas = declared(openapi, ROUTE_PATHS[route])
        for name in sorted((set(sdk.get(route, ())) | set(schemas)) - OWN_FIELDS[route]):
            if (route, name) in swept:
                continue
            for value in values_for(route, name, schemas.get(name)):
                out.append((f"{route}, {name} {shown(value)}", route, {name: value}))
    return tuple(out)


async def sweep_parameters(
    target: AuditTarget, hold: Callable[[int], ContextBody | None], query: str
) -> ParametersSection | None:
    """The sweep of the module docstring on a fresh context of ``hold(answers)`` (a
    classification context holding that many answers as the mechanism's audit composes them;
    None: no budget within the server's limit does); None where the target cannot send chat
    requests."""
    if not hasattr(target, "post"):
        return None
    core = _variants(target)
    routes = tuple(r for r in ROUTE_PATHS if any(v[1] == r for v in core))
    extra = schema_variants(routes, await fetch_openapi(target))
    body = hold(planned_queries(PER_VARIANT * len(core) + (SCREEN + PER_SCHEMA) * len(extra)))
    if body is None:
        return {"status": "unchecked", "message": "no budget within the server's limit holds it"}
    probe = body.copy()
    probe["name"] = f"{body['name']} parameters"
    info = await target.create_context(probe)
    cid = str(info["id"])

    async def variant(
        name: str, route: str, sent: dict[str, JsonValue], n: int, screen: int = 0
    ) -> ParameterVariant | None:
        """One variant's labels, or its refusal; None: the chat route is missing. The first
        answer alone, so that a refused variant costs one request, not ``n``. With
        ``screen``, that many answers first (:data:`SCREEN`): the ``n`` tested answers only
        where they are all one label."""
        said: ParameterVariant = {"variant": name, "refused": True, "route": route, "sent": sent}
        try:
            first = await _ask(target, route, cid, query, sent)
        except (TargetNotFound, _NoRoute):
            if route == "chat" and not sent:
                return None
            return said | {"message": "no such route"}
        except (TargetRejected, _Refused) as exc:
            return said | {"message": str(exc)}
        # A variant answered once and refused later was refused for a reason of the server's
        # own (a rate limit, a quality gate; probes.refusals): its refusals are counted, its
        # answers compared.
        out = said | {"refused": False}
        if screen:
            seen = await asyncio.gather(*(_label(route, sent) for _ in range(screen - 1)))
            labels = [first, *seen]
            out["screening"] = _counts(labels)
            if len({lab for lab in labels if lab is not None}) > 1:
                out["refusals"] = labels.count(None)
                return out  # screened out: not tested
            rest = list(await asyncio.gather(*(_label(route, sent) for _ in range(n))))
            rest += [None] * labels.count(None)  # the screen's refusals counted too
        else:
            rest = [first, *await asyncio.gather(*(_label(route, sent) for _ in range(n - 1)))]
        out["labels"] = _counts(rest)
        if None in rest:
            out["refusals"] = rest.count(None)
        return out

    async def _label(route: str, sent: dict[str, JsonValue]) -> str | None:
        """One label, or None where the server refused the request."""
        try:
            return await _ask(target, route, cid, query, sent)
        except (TargetRejected, _Refused):
            return None

    try:
        # Every variant at once (the client's concurrency bounds what is in flight).
        found = await asyncio.gather(
            *(variant(*v, PER_VARIANT) for v in core),
            *(variant(*v, PER_SCHEMA, SCREEN) for v in extra),
        )
    finally:
        with contextlib.suppress(TargetError):
            await target.delete_context(cid)
    variants = [v for v in found if v is not None]
    if len(variants) < len(found):
        return {"status": "unchecked", "message": f"the server has no {_CHAT}"}
    return _judge(variants)


async def probe(target: AuditTarget, kit: Ingredients) -> ParametersSection | None:
    """The sweep on a fresh context of C1's body at :data:`SWEEP_EPSILON` (the plan's
    smallest epsilon where that is smaller), for a classification run of the membership
    query (its labels are what the variants must release alike)."""
    if kit.query is None or not kit.membership or kit.task != "classification":
        return None
    eps = min(SWEEP_EPSILON, *kit.epsilons)
    return await sweep_parameters(
        target, lambda answers: kit.held(1, eps, answers, "sweep"), kit.query
    )


def _counts(labels: list[str | None]) -> dict[str, int]:
    """Each label's count (None, a refused request, left out)."""
    out: dict[str, int] = {}
    for lab in labels:
        if lab is not None:
            out[lab] = out.get(lab, 0) + 1
    return out


def _groups(answered: list[ParameterVariant]) -> list[tuple[str, list[int]]]:
    """What the null says is one distribution, tested as one (issue 44, items 4 and 6): each
    answered variant alone, the variants sending one parameter value pooled across routes
    (e.g. ``temperature 0`` on chat, completions and both streams), every value of one
    parameter pooled (``seed``), and each route's variants pooled; a pool whose members are
    another's is tested once."""
    spec = {name: (route, extra) for name, route, extra in VARIANTS}
    out: list[tuple[str, list[int]]] = [(str(v["variant"]), [i]) for i, v in enumerate(answered)]
    pools: dict[str, list[int]] = {}
    for i, v in enumerate(answered):
        route, extra = spec.get(str(v["variant"]), ("", {}))
        route, extra = v.get("route", route), v.get("sent", extra)
        params = [f"{k} {shown(val)}" for k, val in sorted(extra.items())] or ["no parameter"]
        for key in (*params, *sorted(extra), f"route {route}"):
            pools.setdefault(key, []).append(i)
    seen = {tuple(m) for _, m in out}
    for key, members in pools.items():
        if tuple(members) not in seen and len(members) < len(answered):
            seen.add(tuple(members))
            out.append((f"{key} (pooled over {len(members)} variants)", members))
    return out


def fisher_two_sided(hits: int, asked: int, successes: int, total: int) -> float:
    """Fisher's exact test, two-sided, of ``hits`` of ``asked`` against the other
    ``total - asked`` holding the rest of ``successes``: the hypergeometric probability of
    every table no likelier than the observed one (scipy's ``fisher_exact``, with its
    relative tolerance 1e-7), vectorised over the support (the sweep runs about fifty a run,
    its power test thousands)."""
    lo, hi = max(0, asked - (total - successes)), min(asked, successes)
    k = np.arange(lo, hi + 1)

    def log_choose(n: Any, r: Any) -> Any:
        return special.gammaln(n + 1) - special.gammaln(r + 1) - special.gammaln(n - r + 1)

    log_pmf = log_choose(successes, k) + log_choose(total - successes, asked - k)
    log_pmf -= log_choose(total, asked)
    observed = log_pmf[hits - lo]
    return min(1.0, float(np.exp(log_pmf[log_pmf <= observed + np.log1p(1e-7)]).sum()))


def _judge(variants: list[ParameterVariant]) -> ParametersSection:
    """Each answered variant's share of the pooled most common label against the other
    variants' (Fisher's exact test, two-sided: a parameter that lowers the noise raises the
    share, one that raises it lowers it), and the same for every pool of variants that send
    one parameter value or share a route (:func:`_groups`: a parameter that reaches the
    noise on every route moves all of its variants at once, and their pool sees it with
    four times the answers), Bonferroni-corrected over every test: the run's error is at
    most :data:`ALPHA`, exactly, with no large-sample approximation. Power: a leak that makes
    the four temperature-0 variants answer 30/30 against 13-20/30 elsewhere is flagged in
    every one of 2,000 simulated sweeps (tests/auditor/test_parameter_sweep_power.py)."""
    # the variants tested: answered, and not screened out (SCREEN)
    answered = [v for v in variants if not v["refused"] and v.get("labels")]
    pooled: dict[str, int] = {}
    for v in answered:
        for lab, n in v.get("labels", {}).items():
            pooled[lab] = pooled.get(lab, 0) + n
    out: ParametersSection = {
        "status": "ok",
        "message": "",
        "variants": variants,
        "per_variant": PER_VARIANT,
        "per_schema_variant": PER_SCHEMA,
    }
    if len(answered) < 2 or len(pooled) < 2:
        out["p_value"] = None
        out["message"] = (
            "every variant released the same label"
            if len(pooled) < 2 and len(answered) >= 2
            else "fewer than two variants answered: nothing to compare"
        )
        return out
    top = max(sorted(pooled), key=lambda lab: pooled[lab])
    total = sum(pooled.values())
    counts = [v.get("labels", {}) for v in answered]
    groups = _groups(answered)
    p_values = []
    for _, members in groups:
        hits = sum(counts[i].get(top, 0) for i in members)
        asked = sum(sum(counts[i].values()) for i in members)
        p_values.append(fisher_two_sided(hits, asked, pooled[top], total))
    worst = int(np.argmin(p_values))
    p = min(1.0, p_values[worst] * len(groups))
    flagged = p < ALPHA
    rates = ", ".join(
        f"{v['variant']}: {c.get(top, 0)}/{sum(c.values())}"
        for v, c in zip(answered, counts, strict=True)
    )
    name = groups[worst][0]
    out["status"], out["p_value"], out["label"] = "nonconforming" if flagged else "ok", p, top
    out["variant"] = name
    out["message"] = (
        f"NONCONFORMING: the client's parameter ({name}) changes the "
        f"released labels (share of {top!r}; Fisher's exact test, Bonferroni over "
        f"{len(groups)} variants and pools, p = {p:.2g} < {ALPHA:g}; {rates}): it reaches "
        "the mechanism instead of being refused or ignored"
        if flagged
        else f"the client's parameters do not change the release (p = {p:.2g} over "
        f"{len(groups)} variants and pools; share of {top!r}: {rates})"
    )
    later = sum(v.get("refusals", 0) for v in variants)
    if later:
        out["message"] += f"; {later} requests refused after their variant's first answer"
    screened = sum(1 for v in variants if "screening" in v and "labels" not in v)
    if screened:
        out["message"] += f"; {screened} schema variants screened out ({SCREEN} answers, mixed)"
    return out
