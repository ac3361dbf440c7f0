"""The server as deployed: budgeted audit contexts, and the ledger audited from outside.

**Budgets.** A production server refuses unbudgeted contexts (``DPICL_ALLOW_UNBUDGETED`` is
off by default), so the auditor gives each of its Gaussian contexts (voting, ESA) a budget
sized to the queries it plans to send there. The composition is re-derived here, not read
from the server: a Gaussian mechanism whose exact curve meets its claim (epsilon, delta) is
mu-GDP with ``mu <= mu_claim = gdp_mu(epsilon, delta)``; ``q`` answers compose to
``sqrt(q) mu``-GDP (Dong, Roth and Su 2019, Cor. 3.3), so the budget
``(gdp_epsilon(sqrt(q) mu_claim, delta), delta)`` holds ``q`` answers whatever calibration
the server uses (:func:`budget_for`). The planned ``q`` has a margin for retried queries.

**The ledger from outside** (:func:`audit_ledger`): a small probe context with a budget of a
few answers, created beside the run's contexts:

1. its reported sigma and sensitivity give the per-answer ``mu = sensitivity / sigma``; the
   budget's ``mu_max = gdp_mu(B, delta)`` then admits exactly ``N = floor(mu_max^2 / mu^2)``
   answers;
2. it is asked until refused: the server must answer exactly ``N`` and refuse the next
   (402 ``budget_exhausted``);
3. after each answer the reported ``spent_epsilon`` must equal ``gdp_epsilon(sqrt(k) mu,
   delta)``, ``remaining_epsilon`` the budget minus it, and ``remaining_queries`` ``N - k``;
4. the context's record after the refusal must still count ``N`` answers (a refused query
   is not charged).

The result is stored under ``results["ledger"]`` and shown in the report's "ledger" section
(:func:`dpicl_audit.report.ledger_section.ledger_html`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.errors import TargetBudgetExhausted, TargetError
from dpicl_audit.estimators.gdp import gdp_epsilon, gdp_mu
from dpicl_audit.planning.ledger_burst import audit_bursts
from dpicl_audit.planning.sections import BurstsSection, LedgerCheck, LedgerSection

__all__ = [
    "LEDGER_PROBE_ANSWERS",
    "MAX_BUDGET_EPSILON",
    "RETRY_MARGIN",
    "answers_in_budget",
    "answers_within_budget",
    "audit_ledger",
    "budget_for",
    "budgeted_answers",
    "composed_epsilon",
    "planned_queries",
]

#: Answers the probe's budget is sized for at the claimed mu (a server with more noise than
#: claimed admits a few more; the probe predicts how many from the sigma it reports).
LEDGER_PROBE_ANSWERS = 2
#: The most answers the probe asks for before it stops (bounded in time and cost).
_PROBE_LIMIT = 64
#: Relative tolerance between a reported figure and the auditor's own composition.
_TOL = 1e-6
#: The largest budget epsilon any dpicl server takes (DPICL_MAX_BUDGET_EPSILON is at most
#: this): the limit of a server that does not publish its own (``limits.max_budget_epsilon``
#: of its /healthz; an older server). A context that needs more than the limit even for one
#: trial is sent unbudgeted (``"budget": null``), which only a server with
#: DPICL_ALLOW_UNBUDGETED accepts; the run refuses to start against one that publishes it
#: does not (:func:`dpicl_audit.planning.budgets.unbudgeted_epsilons`).
MAX_BUDGET_EPSILON = 1000.0
#: Planned queries are multiplied by this and given a few more: retries after lost answers.
RETRY_MARGIN = 1.05
_RETRY_EXTRA = 8


#: Asks the probe context (its id) the query once: the answer's JSON.
Ask = Callable[[str], Awaitable[Mapping[str, Any]]]


def composed_epsilon(mu: float, answers: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``answers`` mu-GDP answers composed."""

    if answers <= 0:
        return 0.0
    return gdp_epsilon(math.sqrt(answers) * mu, delta)


def planned_queries(trials_in_world: int) -> int:
    """The answers a context is budgeted for: its planned queries, with the retry margin."""
    return math.ceil(max(1, trials_in_world) * RETRY_MARGIN) + _RETRY_EXTRA


def budget_for(
    epsilon: float, delta: float, answers: int, limit: float = MAX_BUDGET_EPSILON
) -> dict[str, float] | None:
    """The ``budget`` of a context whose mechanism claims (epsilon, delta) per answer and
    that must hold ``answers`` answers (module docstring); None (unbudgeted) when that is
    above ``limit``, the largest budget epsilon the server takes (its published
    ``limits.max_budget_epsilon``, :data:`MAX_BUDGET_EPSILON` for one that publishes none)."""

    mu_claim = gdp_mu(float(epsilon), float(delta))
    total = composed_epsilon(mu_claim, answers, float(delta))
    # A hair above the composition: the server's own rounding must not refuse the last one.
    b = float(total * (1.0 + 1e-6) + 1e-9)
    return (
        None if b > min(float(limit), MAX_BUDGET_EPSILON) else {"epsilon": b, "delta": float(delta)}
    )


def answers_in_budget(epsilon: float, delta: float, limit: float = MAX_BUDGET_EPSILON) -> int:
    """The most answers at (epsilon, delta) one budget within ``limit`` holds (0: not even
    one): exactly those :func:`budget_for` gives a budget for."""

    mu_claim = gdp_mu(float(epsilon), float(delta))
    mu_max = gdp_mu(min(float(limit), MAX_BUDGET_EPSILON) * (1.0 - 1e-6), float(delta))
    fit = math.floor((mu_max / mu_claim) ** 2)
    # The closed form and budget_for's margin may disagree by one at the boundary.
    while fit > 0 and budget_for(epsilon, delta, fit, limit) is None:
        fit -= 1
    while budget_for(epsilon, delta, fit + 1, limit) is not None:
        fit += 1
    return fit


def answers_within_budget(epsilon: float, delta: float, limit: float = MAX_BUDGET_EPSILON) -> int:
    """The most trials one context can be planned for (retry margin included) with a budget
    of at most ``limit``, at (epsilon, delta) per answer.

    Where the budget holds fewer answers than one trial's margin (a server whose limit is low
    for this epsilon), half of what it holds (at least 1): such a context is budgeted for all
    it holds (:func:`budgeted_answers`), the other half for retries."""

    fit = answers_in_budget(epsilon, delta, limit)
    n = max(1, math.floor((fit - _RETRY_EXTRA) / RETRY_MARGIN) - 1)
    while n > 1 and planned_queries(n) > fit:
        n -= 1
    if planned_queries(n) > fit:
        return max(1, fit // 2)
    return n


def budgeted_answers(
    epsilon: float, delta: float, trials: int, limit: float = MAX_BUDGET_EPSILON
) -> int:
    """The answers a context planned for ``trials`` trials is budgeted for: the trials with
    the retry margin (:func:`planned_queries`), or as many as a budget within ``limit``
    holds where the whole margin does not fit but the trials do."""

    answers = planned_queries(trials)
    fit = answers_in_budget(epsilon, delta, limit)
    return fit if trials <= fit < answers else answers


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=_TOL, abs_tol=1e-9)


async def audit_ledger(
    target: AuditTarget,
    body: ContextBody,
    query: str,
    *,
    ask: Ask,
    limit: float = MAX_BUDGET_EPSILON,
    bursts: bool = True,
) -> LedgerSection:
    """Create a probe context from ``body`` (a Gaussian mechanism's context body) with a
    budget of :data:`LEDGER_PROBE_ANSWERS` answers (within ``limit``, the server's largest
    budget epsilon), ask it ``query`` through ``ask(cid)`` (an awaitable returning the
    answer's JSON) until refused, and check the ledger's figures (module docstring). Returns
    the ``ledger`` section of the results."""

    mech: Mapping[str, Any] = body["mechanism"]  # the settings as the body sends them
    eps, delta = float(mech["epsilon"]), float(mech["delta"])
    # One answer where the server's limit holds no more at this epsilon: the refusal of the
    # second is still checked.
    budget = budget_for(eps, delta, LEDGER_PROBE_ANSWERS, limit) or budget_for(eps, delta, 1, limit)
    if budget is None:
        return {
            "status": "unchecked",
            "checks": [],
            "message": f"no budget within the server's limit of epsilon {limit:g} holds "
            f"one answer at epsilon {eps:g}",
        }
    probe = body.copy()
    probe["name"], probe["budget"] = f"{body['name']} ledger", budget
    out: LedgerSection = {"budget": budget, "checks": [], "status": "unchecked"}
    try:
        info = await target.create_context(probe)
    except TargetError as exc:
        out["message"] = f"the probe context could not be created: {exc}"
        return out
    cid = str(info["id"])
    try:
        out = await _probe(target, cid, info, budget, query, ask, out, gdp_mu(*_b(budget)))
    finally:
        with contextlib.suppress(TargetError):  # a probe left behind answers nothing more
            await target.delete_context(cid)
    if not bursts:
        return out
    # The same budget under concurrency, on every answering route (planning.ledger_burst).
    return with_bursts(out, await audit_bursts(target, body, query, budget))


def with_bursts(out: LedgerSection, found: BurstsSection) -> LedgerSection:
    """The ledger's section ``out`` with the bursts' ``found`` (planning.ledger_burst): a
    failed burst makes it NONCONFORMING."""
    out["bursts"] = found
    if found["status"] == "nonconforming":
        bad = "; ".join(r["message"] for r in found["routes"] if r.get("ok") is False)
        if out["status"] == "ok":
            out["status"], out["message"] = "nonconforming", "under concurrency: " + bad
        elif out["status"] != "unchecked":
            out["message"] = out.get("message", "") + "; under concurrency: " + bad
        else:
            out["status"], out["message"] = "nonconforming", "under concurrency: " + bad
    return out


def _b(budget: Mapping[str, float]) -> tuple[float, float]:
    return float(budget["epsilon"]), float(budget["delta"])


async def _probe(
    target: AuditTarget,
    cid: str,
    info: Mapping[str, Any],
    budget: Mapping[str, float],
    query: str,
    ask: Ask,
    out: LedgerSection,
    mu_max: float,
) -> LedgerSection:
    mech: Mapping[str, Any] = info.get("mechanism") or {}
    sigma, sens = mech.get("sigma"), mech.get("sensitivity")
    checks = out["checks"]
    if sigma is None or sens is None:
        out["message"] = "the context reports no sigma or sensitivity: nothing to compose"
        return out
    mu = float(sens) / float(sigma)
    delta = float(budget["delta"])
    expected = math.floor(mu_max**2 / mu**2 * (1.0 + 1e-9))
    # What the claim implies (issue 35, item 4): a mechanism that meets its (epsilon, delta)
    # is at most mu_claim-GDP per answer, so the budget holds at least this many answers;
    # a reported noise that admits fewer is weaker than claimed (a BUG, not a departure of
    # the ledger from its own costs).
    claimed = mech.get("epsilon")
    implied = (
        None
        if claimed is None
        else math.floor(mu_max**2 / gdp_mu(float(claimed), delta) ** 2 * (1.0 + 1e-6))
    )
    out["mu_per_answer"], out["answers_expected"] = mu, expected
    out["answers_claimed"] = implied
    if implied is not None:
        checks.append(
            {
                "check": "the reported noise admits the answers the claim implies",
                "ok": expected >= implied,
                "reported": expected,
                "expected": implied,
            }
        )
    if expected > _PROBE_LIMIT:
        out["message"] = (
            f"the probe's budget admits {expected} answers at the reported sigma, more than "
            f"the {_PROBE_LIMIT} the audit asks: the server's noise is far above its claim"
        )
        return out
    answered, refused_at = 0, None
    mismatches: list[LedgerCheck] = []
    for k in range(1, expected + 2):
        try:
            ans = await ask(cid)
        except TargetBudgetExhausted:
            refused_at = k
            break
        answered += 1
        got = ans.get("budget") or {}
        spent = composed_epsilon(mu, k, delta)
        want: dict[str, int | float] = {
            "queries": k,
            "spent_epsilon": spent,
            "remaining_epsilon": float(budget["epsilon"]) - spent,
            "remaining_queries": expected - k,
        }
        for key, value in want.items():
            ok = got.get(key) == value if key.endswith("queries") else _close(got.get(key), value)
            if not ok:
                mismatches.append(
                    {
                        "check": f"reported {key} after {k} answers",
                        "ok": False,
                        "reported": got.get(key),
                        "expected": value,
                    }
                )
    checks.append(
        {
            "check": "reported spend and remaining equal the composition of the reported costs",
            "ok": not mismatches,
            "reported": None if not mismatches else mismatches[0].get("reported"),
            "expected": None if not mismatches else mismatches[0].get("expected"),
            "where": None if not mismatches else mismatches[0]["check"],
        }
    )
    checks.append(
        {
            "check": "refuses exactly when the budget is spent",
            "ok": answered == expected and refused_at == expected + 1,
            "reported": answered,
            "expected": expected,
        }
    )
    after = await target.get_context(cid)
    reported = (after.get("spent") or {}).get("queries")
    # A deployment that reports no count after the refusal (an OpenAI-compatible one without
    # dpicl's extension) cannot be checked here: unobserved, not a departure.
    charged = None if reported is None else int(reported)
    checks.append(
        {
            "check": "a refused query is not charged",
            "ok": None if charged is None else charged == answered,
            "reported": charged,
            "expected": answered,
        }
    )
    failed = [c for c in checks if c["ok"] is False]
    out["answers"], out["refused_at"] = answered, refused_at
    weaker = implied is not None and expected < implied
    out["status"] = "bug" if weaker else "nonconforming" if failed else "ok"
    out["message"] = (
        "the ledger departs from the composition of its reported costs: "
        + "; ".join(
            f"{c.get('where') or c['check']}: {c.get('reported')} (expected {c.get('expected')})"
            for c in failed
        )
        if failed
        else f"the ledger answered {answered} queries, refused the next and charged nothing "
        "for it; every reported spend equals the composition of the reported costs"
    )
    return out
