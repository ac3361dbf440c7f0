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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats

from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.errors import TargetError, TargetNotFound, TargetRejected
from dpicl_audit.estimators.composition import planned_queries
from dpicl_audit.probes.answers import read_answer
from dpicl_audit.probes.answers import request as surface_request
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.probes.sections import ParametersSection, ParameterVariant

__all__ = [
    "ALPHA",
    "PER_VARIANT",
    "SWEEP_ANSWERS",
    "SWEEP_EPSILON",
    "VARIANTS",
    "probe",
    "sweep_parameters",
]

#: Error of the homogeneity test (a correct server is flagged in at most this share of runs).
ALPHA = 1e-4
#: Answers asked per variant.
PER_VARIANT = 30
#: The sweep's epsilon: the noisier the release, the further a parameter that removes the
#: noise moves it. Temperature-scaled noise on the chat path makes two variants (chat and
#: chat streamed, temperature 0) answer the majority 30 times in 30, which also raises the
#: pool they are compared with. At the default plan's first epsilon (1; the pivotal C1's
#: honest share Phi(2 / (sigma sqrt 2)) = 0.58 at sigma 6.85) the test missed 2 runs in 5
#: (p 1.4e-4 against ALPHA); at 0.25 (share 0.52) the expected p is 1.8e-6, 1.1e-5 with the
#: pool one standard deviation up.
SWEEP_EPSILON = 0.25
#: The client parameters swept: (name, route as probes.surface names it, the body's extra
#: fields). The first is the reference the departing variant is named against.
VARIANTS: tuple[tuple[str, str, dict[str, float]], ...] = (
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


async def _ask(target: Any, route: str, cid: str, query: str, extra: Mapping[str, Any]) -> str:
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


def _variants(target: Any) -> tuple[tuple[str, str, dict[str, float]], ...]:
    """The variants this client can send: the chat route's through a JSON-only client, no
    native route through ``--api openai``."""
    if not hasattr(target, "send"):
        return tuple(v for v in VARIANTS if v[1] == "chat")
    if isinstance(target, OpenAIClient):
        return tuple(v for v in VARIANTS if v[1] != "native")
    return VARIANTS


#: The answers a sweep asks for: what its context's budget must hold.
SWEEP_ANSWERS = planned_queries(PER_VARIANT * len(VARIANTS))


async def sweep_parameters(
    target: AuditTarget, body: ContextBody | None, query: str
) -> ParametersSection | None:
    """The sweep of the module docstring on a fresh context of ``body`` (a classification
    context holding :data:`SWEEP_ANSWERS` answers as the mechanism's audit composes them;
    None: no budget within the server's limit does); None where the target cannot send chat
    requests."""
    if not hasattr(target, "post"):
        return None
    if body is None:
        return {"status": "unchecked", "message": "no budget within the server's limit holds it"}
    probe = body.copy()
    probe["name"] = f"{body['name']} parameters"
    info = await target.create_context(probe)
    cid = str(info["id"])

    async def variant(name: str, route: str, extra: dict[str, float]) -> ParameterVariant | None:
        """One variant's labels, or its refusal; None: the chat route is missing. The first
        answer alone, so that a refused variant costs one request, not PER_VARIANT."""
        try:
            first = await _ask(target, route, cid, query, extra)
            rest = await asyncio.gather(
                *(_ask(target, route, cid, query, extra) for _ in range(PER_VARIANT - 1))
            )
        except (TargetNotFound, _NoRoute):
            if route == "chat" and not extra:
                return None
            return {"variant": name, "refused": True, "message": "no such route"}
        except (TargetRejected, _Refused) as exc:
            return {"variant": name, "refused": True, "message": str(exc)}
        counts: dict[str, int] = {}
        for lab in (first, *rest):
            counts[lab] = counts.get(lab, 0) + 1
        return {"variant": name, "refused": False, "labels": counts}

    try:
        # Every variant at once (the client's concurrency bounds what is in flight).
        found = await asyncio.gather(*(variant(*v) for v in _variants(target)))
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
    return await sweep_parameters(target, kit.held(1, eps, SWEEP_ANSWERS, "sweep"), kit.query)


def _groups(answered: list[ParameterVariant]) -> list[tuple[str, list[int]]]:
    """What the null says is one distribution, tested as one (issue 44, item 6): each
    answered variant alone, the variants sending one parameter value pooled across routes
    (e.g. ``temperature 0`` on chat, completions and both streams), and each route's
    variants pooled; a pool whose members are another's is tested once."""
    spec = {name: (route, extra) for name, route, extra in VARIANTS}
    out: list[tuple[str, list[int]]] = [(str(v["variant"]), [i]) for i, v in enumerate(answered)]
    pools: dict[str, list[int]] = {}
    for i, v in enumerate(answered):
        route, extra = spec.get(str(v["variant"]), ("", {}))
        params = [f"{k} {val:g}" for k, val in sorted(extra.items())] or ["no parameter"]
        for key in (*params, f"route {route}"):
            pools.setdefault(key, []).append(i)
    seen = {tuple(m) for _, m in out}
    for key, members in pools.items():
        if tuple(members) not in seen and len(members) < len(answered):
            seen.add(tuple(members))
            out.append((f"{key} (pooled over {len(members)} variants)", members))
    return out


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
    answered = [v for v in variants if not v["refused"]]
    pooled: dict[str, int] = {}
    for v in answered:
        for lab, n in v.get("labels", {}).items():
            pooled[lab] = pooled.get(lab, 0) + n
    out: ParametersSection = {
        "status": "ok",
        "message": "",
        "variants": variants,
        "per_variant": PER_VARIANT,
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
        rest_hits, rest = pooled[top] - hits, total - asked
        table = [[hits, asked - hits], [rest_hits, rest - rest_hits]]
        p_values.append(float(stats.fisher_exact(table).pvalue))
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
    return out
