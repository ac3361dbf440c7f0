"""The ledger under concurrency, per answering route (issue 35, item 3).

The sequential probe (:func:`dpicl_audit.probes.ledger.audit_ledger`) sees a ledger that
miscounts; it cannot see one whose check and charge are two steps (check the budget, run the
model, charge): asked one at a time, such a ledger refuses exactly when it should. So, on
each answering route a server offers (native ``/v1/classify``, OpenAI ``/v1/chat/completions``
and ``/v1/completions``, and chat streamed), a fresh context whose budget admits ``N``
answers at the noise it reports (``N = floor(mu_max^2 / mu^2)``, as the probe predicts it) is
sent ``N + k`` requests all in flight together (:data:`BURST_EXTRA` = k), without retries.
Then:

* at most ``N`` are answered (more: the ledger admitted answers its budget does not hold);
* exactly ``N`` are (fewer: a refusal before the planned count, a finding: the ledger refused
  answers its budget holds, or charged some twice);
* every other request is refused as over budget (403, or 429 on the OpenAI surface), none
  fails otherwise (a refusal for a reason of the server's own, a 4xx but an exhausted
  budget, is an observation, :mod:`.refusals`: the route's counts are not read then, and
  the bursts read ``refused``);
* the context's record counts the answers, and its spend rows (``GET /v1/contexts/{id}/spend``,
  where the server has it) hold one ``answered`` row per answer.

A route the server does not offer (404 for the route) is listed as such, not a finding; an
audit through the OpenAI surface (``--api openai``) bursts its three routes only. Each
burst context is deleted afterwards. The result is ``results["ledger"]["bursts"]``; a failed
check makes the ledger NONCONFORMING (exit 4).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import JsonValue

from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.context_info import ContextInfo, MechanismInfo, context_info
from dpicl_audit.errors import TargetError, TargetNotFound
from dpicl_audit.estimators.gdp import gdp_mu
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.probes.sections import BurstFailure, BurstRoute, BurstsSection

__all__ = ["BURST_EXTRA", "ROUTES", "ROUTES_GENERATION", "audit_bursts"]

#: Requests beyond the budget's answers in each burst (16 in flight on a budget of 2).
BURST_EXTRA = 14
#: The answering routes, in the order they are probed.
ROUTES = ("native", "chat", "completions", "chat-stream")
#: The burst's budget holds at most this many answers (a noise far above its claim would
#: otherwise make the burst large).
_MAX_ANSWERS = 16


#: The answering routes of a generation context (DPS-MOZO, ESA): completions streamed too.
ROUTES_GENERATION = ("native", "completions", "chat-stream", "completions-stream")


def _request(
    route: str, cid: str, query: str, task: str = "classification"
) -> tuple[str, JsonObject]:
    if route == "native":
        path = "/v1/classify" if task == "classification" else "/v1/generate"
        return path, {"context_id": cid, "query": query}
    body: JsonObject
    if route.startswith("completions"):
        path, body = "/v1/completions", {"model": cid, "prompt": query}
    else:
        path = "/v1/chat/completions"
        body = {"model": cid, "messages": [{"role": "user", "content": query}]}
    if route.endswith("-stream"):
        body["stream"] = True
    return path, body


def _code(response: httpx.Response) -> str | None:
    try:
        payload = response.json()
    except ValueError:
        return None
    err = payload.get("error") if isinstance(payload, dict) else None
    return str(err.get("code")) if isinstance(err, dict) else None


def _streamed_error(response: httpx.Response) -> str | None:
    """The error code an event stream carries instead of an answer (None: it answered)."""
    for line in response.text.splitlines():
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        with contextlib.suppress(ValueError):
            event = json.loads(line[5:])
            if isinstance(event, dict) and isinstance(event.get("error"), dict):
                return str(event["error"].get("code") or "error")
    return None


def _outcome(route: str, got: httpx.Response | Exception) -> str:
    """``answered``, ``refused`` (over budget), ``no-route`` or what else happened."""
    if isinstance(got, Exception):
        return f"transport error {type(got).__name__}"
    if got.status_code == 200:
        if route.endswith("-stream"):
            code = _streamed_error(got)
            if code is not None:
                return "refused" if code == "budget_exhausted" else f"stream error {code}"
        return "answered"
    code = _code(got)
    if got.status_code in (402, 403, 429) and code == "budget_exhausted":
        return "refused"
    if (
        got.status_code in (404, 405)
        and code in (None, "not_found")
        and "context" not in (got.text or "")
    ):
        return "no-route"
    return f"HTTP {got.status_code} {code or ''}".strip()


def _expected(info: ContextInfo, budget: Mapping[str, float] | None) -> int | str:
    """The answers the burst context admits: its own query limit where it has one (DPS-MOZO's
    ``queries``), else those its budget holds at the noise it reports; or why not known."""
    mech: MechanismInfo = info.get("mechanism") or {}
    if budget is None:
        queries = mech.get("queries")
        return int(queries) if isinstance(queries, int) else "no query limit reported"
    sigma, sens = mech.get("sigma"), mech.get("sensitivity")
    if sigma is None or sens is None:
        return "no sigma or sensitivity reported"
    mu = float(sens) / float(sigma)
    mu_max = gdp_mu(float(budget["epsilon"]), float(budget["delta"]))
    return math.floor(mu_max**2 / mu**2 * (1.0 + 1e-9))


async def _one_route(
    target: Any,
    route: str,
    body: ContextBody,
    query: str,
    budget: Mapping[str, float] | None,
) -> BurstRoute:
    probe: ContextBody = {**body, "name": f"{body.get('name')} burst {route}"}
    if budget is not None:
        probe["budget"] = dict(budget)
    task = str(body.get("task") or "classification")
    info = context_info(await target.create_context(probe))
    cid = info["id"]
    try:
        expected = _expected(info, budget)
        if isinstance(expected, str):
            return {"route": route, "ok": None, "message": expected}
        if expected > _MAX_ANSWERS:
            return {"route": route, "ok": None, "message": f"the budget holds {expected} answers"}
        path, req = _request(route, cid, query, task)
        sent = expected + BURST_EXTRA
        outcomes = [_outcome(route, r) for r in await target.burst(path, [req] * sent)]
        if all(o == "no-route" for o in outcomes):
            return {"route": route, "ok": None, "message": f"the server has no {path}"}
        answered = outcomes.count("answered")
        refused = outcomes.count("refused")
        other = sorted({o for o in outcomes if o not in ("answered", "refused")})
        # A refusal for a reason of the server's own (a rate limit, a quality gate: a 4xx
        # but an exhausted budget) is an observation, not a departure of the ledger
        # (probes.refusals): the burst's counts cannot be read against its budget then.
        own = [o for o in outcomes if o.startswith("HTTP 4") or o.startswith("stream error")]
        if own:
            return {
                "route": route,
                "ok": None,
                "refused": len(own),
                "message": f"{route}: {len(own)} of {sent} in flight refused for a reason of "
                f"the server's own ({', '.join(sorted(set(own)))}): the burst's counts "
                "were not read against its budget",
            }
        after = await target.get_context(cid)
        charged = (after.get("spent") or {}).get("queries")
        rows: int | None = None
        with contextlib.suppress(TargetError, AttributeError):
            report = await target.spend(cid)
            rows = sum(int(k.get("answered") or 0) for k in report.get("by_key") or [])
        checks: list[tuple[str, bool, JsonValue, JsonValue]] = [
            ("at most the budget's answers admitted", answered <= expected, answered, expected),
            ("no refusal before the budget's answers", answered >= expected, answered, expected),
            ("every other request refused as over budget", not other, [*other], []),
            (
                "the context's record counts the answers",
                charged in (None, answered),
                charged,
                answered,
            ),
            ("one answered spend row per answer", rows in (None, answered), rows, answered),
        ]
        failed: list[BurstFailure] = [
            {"check": c, "reported": got, "expected": want} for c, ok, got, want in checks if not ok
        ]
        message = f"{route}: {sent} in flight on a budget of {expected}: {answered} answered, "
        message += f"{refused} refused" + "".join(
            f"; {f['check']}: {f['reported']} (expected {f['expected']})" for f in failed
        )
        return {
            "route": route,
            "path": path,
            "in_flight": sent,
            "answers_expected": expected,
            "answered": answered,
            "refused": refused,
            "other": other,
            "charged": charged,
            "spend_rows_answered": rows,
            "ok": not failed,
            "failed": failed,
            "message": message,
        }
    finally:
        with contextlib.suppress(TargetError):
            await target.delete_context(cid)


async def audit_bursts(
    target: AuditTarget,
    body: ContextBody,
    query: str,
    budget: Mapping[str, float] | None,
    routes: tuple[str, ...] | None = None,
) -> BurstsSection:
    """Burst each route in ``routes`` (module docstring; default: :data:`ROUTES`, or
    :data:`ROUTES_GENERATION` for a generation body) on a fresh context of ``body`` with
    ``budget`` (None: a context limited by its own ``queries``, DPS-MOZO's); the ``bursts``
    section of the ledger's results."""
    if routes is None:
        routes = ROUTES if body.get("task") == "classification" else ROUTES_GENERATION
    if not hasattr(target, "burst"):
        return {"status": "unchecked", "routes": [], "message": "the client cannot burst"}
    if isinstance(target, OpenAIClient):  # an OpenAI-compatible deployment: its own routes
        routes = tuple(r for r in routes if r != "native")
    found: list[BurstRoute] = []
    for route in routes:
        try:
            found.append(await _one_route(target, route, body, query, budget))
        except TargetNotFound as exc:
            found.append({"route": route, "ok": None, "message": str(exc)})
    failed = [r for r in found if r.get("ok") is False]
    own = [r for r in found if r.get("ok") is None and r.get("refused")]
    return {
        "status": "nonconforming" if failed else "refused" if own else "ok",
        "routes": found,
        "message": "; ".join(r["message"] for r in found),
    }
