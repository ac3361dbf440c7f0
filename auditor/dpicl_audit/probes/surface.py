"""The whole response on every answering route, and ``max_tokens`` against the context's limit
(issue 35, items 1 and 2).

The trials observe one route (native, or chat with ``--api openai``) and only the JSON body.
A server may leak elsewhere: in a header (``X-DPICL-*`` or any other), in the metadata of a
streamed chunk, in ``usage`` or ``finish_reason`` of a route the trials never use. So, after the
trials, a fresh pair of contexts of the run's C1 and C0 bodies (the first epsilon, budgeted for
the probe) is asked the audit query :data:`PER_WORLD` (20) times per world on each answering route:
native (``/v1/classify`` or ``/v1/generate``), ``/v1/chat/completions`` and
``/v1/completions``, each also streamed (``stream_options.include_usage`` on). Every answer is
read whole:

* **Fields** (:func:`read_answer`): the body's fields besides the answer and what is public
  by design (:func:`dpicl_audit.estimators.extra_fields.response_fields`), every header but
  the transport's own (:data:`TRANSPORT`) and the public cost headers, and, streamed, the
  chunks' metadata (their count, the closing chunk's fields, the usage chunk's, and every
  other chunk's values besides the text). Each field, named ``<route>: <field>``, is tested for
  dependence on the world given the released answer (:func:`~dpicl_audit.estimators.
  extra_fields.dependence_test`, Bonferroni over every route, field and answer, 1e-4): a
  dependent field is a VIOLATION naming the route and the field. A generation probe asks
  ``max_tokens: 1`` so that answers repeat and can be compared.
* **Time to first token** (streamed routes): each stream's seconds from the request to its
  first chunk with text (:meth:`~dpicl_audit.client.DpiclClient.send_streamed`; a role-only
  first chunk does not count), tested as the trials' times are
  (:func:`~dpicl_audit.estimators.channels.times_test`: does one world take more than 1.25
  times the other's, given the route and the released answer; error :data:`FIRST_TOKEN_ALPHA`,
  1e-4). The trials are never streamed, so a delay of streams alone is seen only here: a
  VIOLATION naming ``time to first token``.
* **Public by design** (the cost and the budget): checked against their own prediction. The
  ``X-DPICL-*`` headers must equal the body's cost and budget (``dpicl`` on the OpenAI
  routes), and every answer's cost must be the same in both worlds (the claim's cost, which
  the ledger probe composes); a departure is NONCONFORMING naming the field, as is a request
  within the probe's budget that is not answered (its budget exhausted before the planned
  count, a dropped connection, an unreadable answer).
* **Refusals** (a 4xx but an exhausted budget: a rate limit, a quality gate): observations
  (:mod:`.refusals`), tested for dependence on the world over every route (Fisher's exact
  test, as the trials' refusals; 1e-4): dependent, a VIOLATION naming them; not dependent,
  the section reads ``refused`` where nothing else is found (the run exits 1).
* **Limits** (generation): each route is also asked with ``max_tokens`` one above the
  context's limit and at four times it. A refusal (4xx) is right; an answer is right only with
  at most the limit's tokens (counted from ``usage.completion_tokens`` and, streamed, the
  chunks that carry text: DPS-MOZO streams one token per chunk). More tokens than the limit,
  or than a request's own ``max_tokens``, is a BUG: the calibration assumed the limit.

The result is ``results["surface"]`` (status ``ok``, ``nonconforming``, ``violation``,
``bug`` or ``refused``); the probe's contexts are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.client.target import AuditTarget, ContextBody
from dpicl_audit.errors import TargetError, TargetRejected
from dpicl_audit.estimators.channels import RefusalTest, TimingTest, times_test
from dpicl_audit.estimators.extra_fields import dependence_test
from dpicl_audit.probes.answers import (
    read_answer,
    request,
    stream_started,
)
from dpicl_audit.probes.costs import public_departures
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.probes.positions import audit_positions, with_positions
from dpicl_audit.probes.refusals import Refused, refused, world_refusals
from dpicl_audit.probes.sections import AboveLimit, Answer, Scalar, SurfaceRoute, SurfaceSection

__all__ = ["PER_WORLD", "ROUTES", "audit_surface", "probe"]

#: Answers per world and route (a classification; a generation's: :data:`PER_WORLD_GENERATION`).
PER_WORLD = 20
#: Answers per world and route of a generation mechanism (DPS-MOZO's answers cost ``|D| + 1``
#: model calls per token).
PER_WORLD_GENERATION = 20
#: The answering routes, in the order they are asked.
ROUTES = ("native", "chat", "completions", "chat-stream", "completions-stream")
#: Error of the streams' time-to-first-token test (the response-field test's rate).
FIRST_TOKEN_ALPHA = 1e-4
#: Fewer answers per world and route than this: the probe is not run (said so).
MIN_PER_WORLD = 10


async def _ask(
    target: Any, route: str, task: str, cid: str, query: str, max_tokens: int | None
) -> Answer | Refused | str:
    """One answer read whole, its refusal (:mod:`.refusals`: an observation), or why there
    is none (``refused <status> budget_exhausted``, ``no-route``, ...)."""
    path, body = request(route, task, cid, query, max_tokens)
    ttft: float | None = None
    try:
        if route.endswith("-stream") and hasattr(target, "send_streamed"):
            got, ttft = await target.send_streamed(path, body, stream_started)
        else:
            got = await target.send(path, body)
    except TargetError as exc:
        return f"failed ({exc})"
    if got.status_code in (404, 405) and "context" not in got.text and "model" not in got.text:
        return "no-route"
    if got.status_code >= 400:
        return refused(got, path)
    try:
        answer = read_answer(route, got)
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable ({exc})"
    if ttft is not None:
        answer["ttft_s"] = ttft
    return answer


async def audit_surface(
    target: AuditTarget,
    bodies: Callable[[int, int], ContextBody],
    query: str,
    *,
    task: str,
    limit: int | None = None,
    per_world: int | None = None,
    capacity: int | None = None,
) -> SurfaceSection | None:
    """The probe of the module docstring. ``bodies(world, answers)``: a context body of that
    world budgeted for ``answers`` answers; ``limit``: the context's ``max_tokens`` (a
    generation mechanism's), None for classification; ``capacity``: the most answers one
    budget within the server's limit holds (fewer answers per route where it holds fewer).
    None where the client cannot send raw requests."""
    if not hasattr(target, "send"):
        return None
    if per_world is None:
        per_world = PER_WORLD if task == "classification" else PER_WORLD_GENERATION
    routes = tuple(r for r in ROUTES if not (r == "native" and isinstance(target, OpenAIClient)))
    extra = 2 * len(routes) if limit is not None else 0
    if capacity is not None:
        per_world = min(per_world, (capacity - extra) // len(routes))
    if per_world < MIN_PER_WORLD:
        return {
            "status": "unchecked",
            "routes": [],
            "message": f"no budget within the server's limit holds {MIN_PER_WORLD} answers "
            f"per route ({len(routes)} routes): the responses were not probed",
        }
    probe = 1 if limit is not None else None  # generation: one token, so that answers repeat
    ids: dict[int, str] = {}
    rows: list[tuple[int, str, Mapping[str, Scalar]]] = []
    first_tokens: list[tuple[int, str, float]] = []
    # every answered or refused request with its world, for the refusals' test (.refusals)
    observed: list[tuple[int, Refused | None]] = []
    departures: list[str] = []
    bugs: list[str] = []
    per_route: list[SurfaceRoute] = []
    try:
        fitted = await _create_pair(target, bodies, per_world, len(routes), extra, ids)
        if isinstance(fitted, str):
            return {"status": "unchecked", "routes": [], "message": fitted}
        per_world = fitted

        async def answers(route: str) -> dict[int, list[Answer | Refused | str]]:
            # The worlds alternate (the client's queue is first come, first served), so that
            # both meet the same load: a stream's first token is timed (issue 44).
            order = [w for _ in range(per_world) for w in (1, 0)]
            got = await asyncio.gather(
                *(_ask(target, route, task, ids[w], query, probe) for w in order)
            )
            return {w: [g for o, g in zip(order, got, strict=True) if o == w] for w in (1, 0)}

        # Every route at once (the client's concurrency bounds what is in flight): one route
        # after another left the client idle at each route's last answers.
        asked = dict(zip(routes, await asyncio.gather(*(answers(r) for r in routes)), strict=True))
        for route in routes:
            got = asked[route]
            if all(g == "no-route" for w in got.values() for g in w):
                per_route.append({"route": route, "status": "no-route"})
                continue
            answered = [(w, a) for w in (1, 0) for a in got[w] if isinstance(a, dict)]
            refusals = [a for w in (1, 0) for a in got[w] if isinstance(a, Refused)]
            observed += [(w, None) for w, _ in answered]
            observed += [(w, a) for w in (1, 0) for a in got[w] if isinstance(a, Refused)]
            failed = [a for w in (1, 0) for a in got[w] if isinstance(a, str)]
            others = sorted(set(failed))
            rows += [
                (w, a["answer"], {f"{route}: {k}": v for k, v in a["fields"].items()})
                for w, a in answered
            ]
            first_tokens += [
                (w, f"{route}: {a['answer']}", float(t))
                for w, a in answered
                if (t := a.get("ttft_s")) is not None
            ]
            departures += public_departures(route, answered)
            if others:  # a refusal before the planned count is a finding (issue 35, item 3)
                departures.append(
                    f"{route}: {len(failed)} of {2 * per_world} requests "
                    f"within the probe's budget not answered ({', '.join(others)})"
                )
            if probe is not None:
                longer = [a["tokens"] or 0 for _, a in answered if (a["tokens"] or 0) > probe]
                if longer:
                    bugs.append(f"{route}: max_tokens {probe} answered with {max(longer)} tokens")
            entry: SurfaceRoute = {
                "route": route,
                "answered": len(answered),
                "other": others,
                "refused": len(refusals),
                "fields": sorted({k for _, a in answered for k in a["fields"]}),
            }
            if limit is not None:
                entry["above_limit"] = await _above_limit(
                    target, route, task, ids[1], query, limit, bugs
                )
            per_route.append(entry)
    finally:
        for cid in ids.values():
            with contextlib.suppress(TargetError):
                await target.delete_context(cid)
    first_token = times_test(first_tokens, FIRST_TOKEN_ALPHA)
    return _conclude(
        rows, per_route, per_world, departures, bugs, limit, first_token, world_refusals(observed)
    )


async def _create_pair(
    target: AuditTarget,
    bodies: Callable[[int, int], ContextBody],
    per_world: int,
    n_routes: int,
    extra: int,
    ids: dict[int, str],
) -> int | str:
    """Create the C1/C0 pair (into ``ids``) budgeted for ``per_world`` answers per route, or
    for half as many, and so on, while the server refuses the context's calibration (a 422 on
    a ``mechanism.*`` parameter: DPS-MOZO's paper mode, say, admits only so many tokens per
    budget). The answers per world and route it settled on; the reason, where not even
    :data:`MIN_PER_WORLD` fit."""

    async def create(world: int) -> str:
        body = bodies(world, per_world * n_routes + extra).copy()
        body["name"] = f"{body.get('name')} surface"
        return str((await target.create_context(body))["id"])

    while True:
        try:
            ids[1] = await create(1)
            break
        except TargetRejected as exc:
            if exc.status != 422 or not (exc.param or "").startswith("mechanism."):
                raise
            if per_world // 2 < MIN_PER_WORLD:
                return (
                    f"the server takes no context of {per_world * n_routes + extra} answers "
                    f"({per_world} per route, {n_routes} routes): {exc.message} (param "
                    f"{exc.param}); the responses were not probed"
                )
            per_world //= 2
    ids[0] = await create(0)
    return per_world


async def _above_limit(
    target: AuditTarget, route: str, task: str, cid: str, query: str, limit: int, bugs: list[str]
) -> list[AboveLimit]:
    """``max_tokens`` one above the context's limit and at four times it, on one route: a
    refusal is right; an answer with more tokens than the limit is a BUG (added to ``bugs``)."""
    above: list[AboveLimit] = []
    for asked in (limit + 1, 4 * limit):
        one = await _ask(target, route, task, cid, query, asked)
        if not isinstance(one, dict):
            above.append({"max_tokens": asked, "outcome": str(one)})
            continue
        above.append({"max_tokens": asked, "outcome": "answered", "tokens": one["tokens"]})
        if (one["tokens"] or 0) > limit:
            bugs.append(
                f"{route}: max_tokens {asked} above the context's limit {limit} "
                f"answered with {one['tokens']} tokens"
            )
    return above


def _conclude(
    rows: list[tuple[int, str, Mapping[str, Scalar]]],
    per_route: list[SurfaceRoute],
    per_world: int,
    departures: list[str],
    bugs: list[str],
    limit: int | None,
    first_token: TimingTest | None = None,
    refusals: RefusalTest | None = None,
) -> SurfaceSection:
    """The section: the dependence test over every route's fields, the streams' time to
    first token and the refusals (:mod:`.refusals`), then the verdict (a BUG before a
    VIOLATION before a NONCONFORMING departure; refusals that do not depend on the world,
    where nothing else is found, read ``refused``)."""
    found = dependence_test(rows)
    out: SurfaceSection = {
        "routes": per_route,
        "per_world": per_world,
        "dependence": found,
        "public": departures,
        "limits": bugs,
        "limit": limit,
        "first_token": first_token,
        "refusals": refusals,
    }
    if bugs:
        out["status"] = "bug"
        out["message"] = (
            "BUG: generated lengths exceed what the client asked or the context's limit, "
            "which its calibration assumes: " + "; ".join(bugs)
        )
    elif found is not None and found["status"] == "violation":
        out["status"], out["message"] = "violation", found["message"]
        out["field"] = found["field"]
    elif first_token is not None and first_token["status"] == "violation":
        out["status"], out["field"] = "violation", "time to first token"
        out["message"] = "streams' time to first token: " + first_token["message"]
    elif refusals is not None and refusals["status"] == "violation":
        out["status"], out["field"] = "violation", "refusals"
        out["message"] = refusals["message"]
    elif departures:
        out["status"] = "nonconforming"
        out["message"] = "NONCONFORMING: public fields depart from their prediction: " + "; ".join(
            departures
        )
    elif refusals is not None:
        out["status"], out["message"] = "refused", refusals["message"]
    else:
        out["status"] = "ok"
        n_fields = len(found["fields"]) if found else 0
        smallest = None if found is None else found.get("p_value")
        out["message"] = (
            f"{len(rows)} answers on {sum(r.get('status') != 'no-route' for r in per_route)} "
            f"routes: no field of {n_fields} depends on the world given the answer"
            + ("" if smallest is None else f" (smallest corrected p = {smallest:.2g})")
            + "; the cost headers equal the body's figures"
            + (f"; max_tokens above the limit {limit} refused or within it" if limit else "")
            + ("" if first_token is None else f"; streams' first token: {first_token['message']}")
        )
    return out


async def probe(target: AuditTarget, kit: Ingredients) -> SurfaceSection | None:
    """Every route's whole response on a fresh C1/C0 pair at the first epsilon, and
    ``max_tokens`` above the context's limit where its calibration composes one
    (:attr:`Ingredients.token_limit`); then, where the mechanism claims a per-token bound,
    each of the first tokens against it (:mod:`.positions`)."""
    query, eps = kit.query, kit.epsilons[0]
    if query is None:
        return None

    def bodies(world: int, answers: int) -> ContextBody:
        body = kit.body(world, eps, f"{kit.name} C{world}")
        # A context no budget holds goes unbudgeted, as the run's own would (the capacity
        # keeps the probe's answers within one budget where the server has a limit).
        return kit.hold(body, eps, answers) or body | {"budget": None}

    capacity = None if kit.capacity is None else kit.capacity(eps)
    surface = await audit_surface(
        target, bodies, query, task=kit.task, limit=kit.token_limit, capacity=capacity
    )
    if isinstance(kit.per_token, str):
        return with_positions(surface, {"status": "unchecked", "message": kit.per_token})
    if kit.per_token is None or kit.token_limit is None:
        return surface
    found = await audit_positions(
        target, bodies, query, max_tokens=kit.token_limit, per_token=kit.per_token
    )
    return with_positions(surface, found)
