"""Inputs up to the limits (issue 44, item 3): no refusal, and nothing said in one, may tell
the worlds apart.

A server checks lengths: the query's (``DPICL_MAX_QUERY_CHARS``, published in ``/healthz``
as ``limits.max_query_chars``), an exemplar's text (20,000 characters, the schema's bound),
and the model's window (a prompt the model cannot take). A check of a *partition's* prompt
(its exemplars around the query) depends on the private exemplars: refused inside the
refunded engine call, it tells neighbours apart for free, and a message that quotes the
prompt's length reads it exactly (dpicl answers such a partition from the public zero-shot
prompt instead: docs/privacy.md, "What the engine may not let depend on the exemplars").
The trials never come near a limit, so this probe does, with inputs sized where only a
private exemplar can push a prompt over one:

* **Contexts.** A fresh pair of the run's bodies at its first epsilon, budgeted for the
  probe: C0 as the run's, C1 as the run's with its canary (the one exemplar where the
  worlds differ) padded to :data:`EXEMPLAR_CHARS` characters (its output too, for a
  generation context), halved while the server refuses that length (a 422 naming an
  exemplar). The two stay neighbours (replace-one) and differ by ~20,000 characters in one
  partition's prompt.
* **Queries.** The audit query, then the same query padded (:func:`padded`: ``" a"``
  repeated, one word and one token per two characters for any tokenizer that splits on
  spaces) to a quarter, a half and three quarters of the published query limit, just under
  it, at it and one above it (more steps where the canary is shorter, so that consecutive
  sizes are closer than the worlds' prompts differ: any limit on a partition's prompt between
  C0's prompt with the audit query and C1's with the longest query is crossed by C1 alone
  at some size). Each size is asked :data:`PER_SIZE` times per world, both worlds at once.
* **Observed** per request: refused or not, status, error code and message (normalised:
  the context's id and any request id removed, :func:`normalise`), and per size and world
  whether refusals were charged (the context's ``spent.queries`` before and after, less
  the answers).
* **Tested** per size, for each of the five fields: the worlds' shares of the size's most
  common value (among refusals, for status, code and message; refusals charged, for
  charged) by Fisher's exact test (two-sided), Bonferroni-corrected over every size and
  field. Below :data:`ALPHA` (1e-4: a server whose refusals do not depend on the world is
  flagged in at most 1 run in 10,000, exactly, whatever its refusals' randomness) is a
  VIOLATION naming the size, the limit near it and the field. A deterministic difference
  at one size (12 against 12) has p = 7.4e-7 before the correction.

The result is ``results["limits"]``; the probe's contexts are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.errors import TargetError, TargetRejected
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.probes.answers import request
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.probes.limits_judge import FIELDS, Finding, Outcome, is_refusal, judge
from dpicl_audit.probes.sections import LimitsSection, LimitsSize, LimitsWorld

__all__ = [
    "ALPHA",
    "EXEMPLAR_CHARS",
    "FIELDS",
    "PER_SIZE",
    "QUERY_CHARS",
    "Finding",
    "judge",
    "normalise",
    "padded",
    "probe",
    "query_sizes",
]

#: Error of the probe's test (module docstring).
ALPHA = 1e-4
#: Requests per size and world: 12 against 12 deterministic outcomes give p = 7.4e-7, below
#: ALPHA after the correction over up to 16 sizes and 5 fields (80 tests: 5.9e-5).
PER_SIZE = 12
#: The canary's length: the schema's bound on an exemplar's text (docs/architecture.md,
#: "Limits"); halved while a server refuses it.
EXEMPLAR_CHARS = 20_000
#: The query limit where the server publishes none: the schema's bound on a query.
QUERY_CHARS = 20_000
#: The shortest canary the probe pads: below it the worlds' prompts differ too little.
MIN_CANARY_CHARS = 1_000
#: The most query sizes asked (the ladder's steps narrow with the canary).
MAX_SIZES = 16
#: The fields compared between the worlds at each size.
_FILLER = " a"
_IDS = re.compile(
    r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[0-9a-f]{16,}\b",
    re.IGNORECASE,
)


def padded(text: str, chars: int) -> str:
    """``text`` padded with ``" a"`` to exactly ``chars`` characters (cut where it is longer);
    never ending in a space (a server may strip it)."""
    out = (text + _FILLER * (chars // 2 + 1))[:chars]
    return out[:-1] + "a" if out.endswith(" ") else out


def normalise(message: str, context_id: str) -> str:
    """A refusal's message without what belongs to the request rather than the world: the
    context's id (each world's is its own) and request ids (UUIDs, long hex)."""
    return _IDS.sub("<id>", message.replace(context_id, "<context>"))


def query_sizes(query_chars: int, limit: int, gap: int) -> list[int]:
    """The query lengths asked (module docstring): the audit query's, the quarters of the
    limit, just under it, at it and one above, with more steps where consecutive sizes would
    be ``gap`` (the worlds' prompts' difference) or more apart."""
    sizes = {query_chars, limit // 4, limit // 2, 3 * limit // 4, limit - 1, limit, limit + 1}
    sizes = {s for s in sizes if s >= query_chars}
    while len(sizes) < MAX_SIZES:
        ordered = sorted(sizes)
        wide = [(b - a, a, b) for a, b in itertools.pairwise(ordered) if b - a >= gap]
        if not wide:
            break
        _, a, b = max(wide)
        sizes.add((a + b) // 2)
    return sorted(sizes)


def _canary_index(one: ContextBody, zero: ContextBody) -> int | None:
    """The one exemplar where the worlds' bodies differ (None where not exactly one does)."""
    e1, e0 = one.get("exemplars") or [], zero.get("exemplars") or []
    differ = [i for i, (a, b) in enumerate(zip(e1, e0, strict=False)) if a != b]
    return differ[0] if len(differ) == 1 and len(e1) == len(e0) else None


def _long_canary(body: ContextBody, at: int, chars: int, task: str) -> ContextBody:
    exemplars = [dict(e) for e in body["exemplars"]]
    canary = exemplars[at]
    canary["input"] = padded(str(canary["input"]), chars)
    if task != "classification":  # a classification output is a label: public, not padded
        canary["output"] = padded(str(canary["output"]), chars)
    return body | {"exemplars": exemplars}


async def _create_long(
    target: AuditTarget, body: ContextBody, at: int, task: str
) -> tuple[str, int] | str:
    """C1 with its canary as long as the server takes (module docstring): (id, its length),
    or why there is none."""
    chars = EXEMPLAR_CHARS
    while True:
        try:
            info = await target.create_context(_long_canary(body, at, chars, task))
            return str(info["id"]), chars
        except TargetRejected as exc:
            if exc.status != 422 or not (exc.param or "").startswith("exemplars"):
                return f"the server refused C1 with a long canary: {exc}"
            if chars // 2 < MIN_CANARY_CHARS:
                return f"the server takes no canary of {MIN_CANARY_CHARS} characters: {exc}"
            chars //= 2


def _outcome(got: Any, context_id: str) -> Outcome:
    """One response's :data:`Outcome`."""
    if got.status_code < 400:
        return got.status_code, "", ""
    code, message = "", got.text[:500]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = got.json().get("error")
        if isinstance(error, Mapping):
            code = str(error.get("code") or error.get("type") or "")
            message = str(error.get("message") or "")
    return got.status_code, code, normalise(message, context_id)


async def _ask(target: Any, path: str, body: JsonObject, cid: str) -> Outcome:
    try:
        return _outcome(await target.send(path, body), cid)
    except TargetError as exc:  # a dropped connection is an outcome too
        return 0, "transport", type(exc).__name__


async def _charged(target: AuditTarget, cid: str) -> int | None:
    """The context's charged answers as its record counts them (None: not reported)."""
    with contextlib.suppress(TargetError, AttributeError, TypeError, ValueError):
        spent = (await target.get_context(cid)).get("spent") or {}
        return int(spent["queries"]) if spent.get("queries") is not None else None
    return None


async def _world_at_size(
    target: Any, route: str, task: str, cid: str, query: str
) -> tuple[list[Outcome], int | None]:
    """:data:`PER_SIZE` requests of one size to one world: their outcomes, and how many of
    its refusals were charged (None where the context reports no count)."""
    path, body = request(route, task, cid, query, None if task == "classification" else 1)
    before = await _charged(target, cid)
    got = list(await asyncio.gather(*(_ask(target, path, body, cid) for _ in range(PER_SIZE))))
    after = await _charged(target, cid)
    answered = sum(not is_refusal(g) for g in got)
    charged = None if before is None or after is None else max(0, after - before - answered)
    return got, charged


def _world(got: Sequence[Outcome], charged: int | None) -> LimitsWorld:
    refused = [g for g in got if is_refusal(g)]
    return {
        "answered": len(got) - len(refused),
        "refused": len(refused),
        "statuses": {str(k): v for k, v in sorted(Counter(g[0] for g in got).items())},
        "codes": dict(Counter(g[1] for g in refused)),
        "messages": dict(Counter(g[2][:300] for g in refused).most_common(3)),
        "charged_refusals": charged,
    }


def _label(chars: int, query_chars: int, limit: int) -> str:
    if chars == query_chars:
        return "the audit query"
    if chars > limit:
        return f"one above the query limit {limit}"
    if chars == limit:
        return f"at the query limit {limit}"
    if chars == limit - 1:
        return f"just under the query limit {limit}"
    return f"{chars / limit:.0%} of the query limit {limit}"


async def audit_limits(target: AuditTarget, kit: Ingredients, query: str) -> LimitsSection | None:
    """The probe of the module docstring; None where the client cannot send raw requests."""
    if not hasattr(target, "send"):
        return None
    eps = kit.epsilons[0]
    one, zero = kit.body(1, eps, f"{kit.name} limits C1"), kit.body(0, eps, f"{kit.name} limits C0")
    at = _canary_index(one, zero)
    if at is None:
        return {"status": "unchecked", "message": "the worlds' bodies differ in no one exemplar"}
    published = await _query_limit(target)
    limit = published or QUERY_CHARS
    route = "chat" if isinstance(target, OpenAIClient) else "native"
    canary_chars = EXEMPLAR_CHARS
    neighbour = len(str(zero["exemplars"][at]["input"]))
    sizes = query_sizes(len(query), limit, max(1, canary_chars - neighbour))
    answers = PER_SIZE * MAX_SIZES  # each context's requests, whatever the ladder becomes
    held1, held0 = kit.hold(one, eps, answers), kit.hold(zero, eps, answers)
    if held1 is None or held0 is None:
        return {"status": "unchecked", "message": "no budget within the server's limit holds it"}
    ids: dict[int, str] = {}
    try:
        made = await _create_long(target, held1, at, kit.task)
        if isinstance(made, str):
            return {"status": "unchecked", "message": made}
        ids[1], canary_chars = made
        if canary_chars < EXEMPLAR_CHARS:  # a shorter canary: closer steps
            sizes = query_sizes(len(query), limit, max(1, canary_chars - neighbour))
        try:
            ids[0] = str((await target.create_context(held0))["id"])
        except TargetRejected as exc:
            return {"status": "unchecked", "message": f"the server refused C0: {exc}"}
        asked = []
        for chars in sizes:  # one size at a time: the charge count is read around each
            text = padded(query, chars) if chars > len(query) else query
            got = await asyncio.gather(
                *(_world_at_size(target, route, kit.task, ids[w], text) for w in (1, 0))
            )
            asked.append((chars, {1: got[0][0], 0: got[1][0]}, {1: got[0][1], 0: got[1][1]}))
    finally:
        for cid in ids.values():
            with contextlib.suppress(TargetError):
                await target.delete_context(cid)
    return _conclude(asked, route, canary_chars, published, len(query), limit)


async def _query_limit(target: AuditTarget) -> int | None:
    """``limits.max_query_chars`` of the server's ``/healthz`` (None where it publishes none)."""
    with contextlib.suppress(TargetError, AttributeError, TypeError, ValueError):
        limits = (await target.health()).get("limits")
        value = limits.get("max_query_chars") if isinstance(limits, Mapping) else None
        return int(value) if isinstance(value, int) and value > 0 else None
    return None


def _conclude(
    asked: Sequence[tuple[int, Mapping[int, Sequence[Outcome]], Mapping[int, Any]]],
    route: str,
    canary_chars: int,
    published: int | None,
    query_chars: int,
    limit: int,
) -> LimitsSection:
    rows: list[LimitsSize] = [
        {
            "query_chars": chars,
            "near": _label(chars, query_chars, limit),
            "C1": _world(outcomes[1], charged[1]),
            "C0": _world(outcomes[0], charged[0]),
        }
        for chars, outcomes, charged in asked
    ]
    found = judge(asked)
    out: LimitsSection = {
        "status": "ok",
        "message": "",
        "route": route,
        "canary_chars": canary_chars,
        "max_query_chars": published,
        "per_size": PER_SIZE,
        "sizes": rows,
    }
    if found is None:
        out["message"] = "no size was asked"
        return out
    p, chars = found.p_value, found.size
    out["p_value"] = p
    if p < ALPHA:
        out["status"], out["field"] = "violation", found.field
        if chars is None:
            where = f"every size pooled ({rows[0]['query_chars']} to {rows[-1]['query_chars']})"
            # and the size where the worlds' refusals differ most, as an example
            row = max(rows, key=lambda r: abs(r["C1"]["refused"] - r["C0"]["refused"]))
            c1 = f"{_pooled(rows, 'C1')} (at {row['query_chars']}: {_said(row['C1'])})"
            c0 = f"{_pooled(rows, 'C0')} (at {row['query_chars']}: {_said(row['C0'])})"
        else:
            row = next(r for r in rows if r["query_chars"] == chars)
            out["size"] = chars
            where = f"a query of {chars} characters, {_label(chars, query_chars, limit)}"
            c1, c0 = _said(row["C1"]), _said(row["C0"])
        out["message"] = (
            f"VIOLATION: near the limits, the refusals' {found.field} depends on the world "
            f"({where}, against a canary of {canary_chars}; Fisher's exact test, Bonferroni "
            f"over {found.tests} size and field tests, p = {p:.2g} < {ALPHA:g}): C1 {c1}; "
            f"C0 {c0}. A limit that only a private exemplar reaches releases it beside the "
            "DP answer"
        )
    else:
        out["message"] = (
            f"{len(rows)} query sizes from {rows[0]['query_chars']} to "
            f"{rows[-1]['query_chars']} characters (query limit {limit}"
            f"{'' if published else ', the schema bound: none published'}), a canary of "
            f"{canary_chars}, {PER_SIZE} per world each: no refusal, status, code, message or "
            f"charge depends on the world (smallest corrected p = {p:.2g})"
        )
    return out


def _pooled(rows: Sequence[LimitsSize], world: Literal["C1", "C0"]) -> str:
    answered = sum(r[world]["answered"] for r in rows)
    refused = sum(r[world]["refused"] for r in rows)
    return f"{answered} answered, {refused} refused"


def _said(world: LimitsWorld) -> str:
    told = f"{world['answered']} answered, {world['refused']} refused"
    if world["codes"]:
        codes = (f"{k or '?'} x{v}" for k, v in world["codes"].items())
        told += f" ({', '.join(codes)})"
    if world["messages"]:
        told += f", e.g. {next(iter(world['messages']))!r}"
    if world["charged_refusals"]:
        told += f", {world['charged_refusals']} refusals charged"
    return told


async def probe(target: AuditTarget, kit: Ingredients) -> LimitsSection | None:
    """The probe on a fresh C1/C0 pair at the first epsilon (module docstring), asked the
    design's query padded up to the limits."""
    if kit.query is None:
        return None
    return await audit_limits(target, kit, kit.query)
