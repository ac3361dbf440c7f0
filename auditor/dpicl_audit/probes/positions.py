"""DPS-MOZO's per-token constraint seen black-box, position by position (issue 35, item 7).

The proven mode holds every token's distribution within ``per_token = 4 eps0`` (``2 eps0``
with one shot) of its neighbour's in log-ratio, whatever the prefix: every token is pure
``per_token``-DP. The trials' "starts with the signal" decision reads one event of the whole
answer against the claim over the whole context; a server that skips the constraint on one
token of each answer (that token drawn from the one-shot distributions unmixed) leaks that
token without moving the signal's rate, so the trials read CONSISTENT.

So, after the trials, a fresh C1/C0 pair of the run's bodies at the first epsilon, each
budgeted for this probe's answers, is asked the audit query :data:`PER_WORLD` times per
world at each probed position ``t`` (:func:`positions`: 1, 2 and ``T_max``), with
``max_tokens: t``. The released text of such an answer is a function of its first ``t``
tokens alone (the decoding loop runs ``t`` steps), which compose to pure
``t * per_token``-DP: for every set ``A`` of texts, ``P1(A) <= exp(t * per_token) P0(A)`` and
the other way round. No tokenizer is assumed: at ``t = 1`` the text is the first token.

The test (:func:`position_test`), per position and direction: the first half of each
world's answers (even indices) chooses ``A`` = the texts seen more often in world ``a`` than
in world ``b`` (a second event: at least :data:`RATIOS` times as often); on the other half,
one-sided Clopper-Pearson bounds give ``epsilon_lower = log(lower(P_a(A)) / upper(P_b(A)))``.
Above ``t * per_token`` (relative slack 1e-9) is a VIOLATION naming the position.
Family-wise error :data:`ALPHA` (Bonferroni over positions, directions, events and the two
intervals): an honest server is flagged in at most 1 run in 1,000, and far less in practice
(the intervals are conservative, and an honest ratio sits below its bound). The probe
context's calibration covers all its answers, so its ``eps0`` is small and the bound is
tight: an unmixed token stands out even where the run's own epsilons are large. ``eps0`` is
the context's reported ``max_log_ratio``, which the claim check (DPS-MOZO's ``claim``) ties
to the claimed epsilon.

The result is ``results["surface"]["positions"]``; a VIOLATION makes the surface's status
``violation`` (exit 5) unless it already reads ``bug``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from dpicl_audit.client import AuditTarget, ContextBody, GenerationTarget
from dpicl_audit.context_info import ContextInfo, context_info
from dpicl_audit.errors import TargetError
from dpicl_audit.estimators.stats import clopper_pearson_lower, clopper_pearson_upper
from dpicl_audit.probes.ingredients import PerToken
from dpicl_audit.probes.sections import PositionRow, PositionsSection, SurfaceSection

__all__ = ["ALPHA", "PER_WORLD", "audit_positions", "position_test", "positions", "with_positions"]

#: Answers per world and probed position (half choose the event, half bound it).
PER_WORLD = 300
#: The probe's family-wise error (an honest server's false alarms per run, at most).
ALPHA = 1e-3
#: Requests in flight at once.
CONCURRENCY = 32
_SLACK = 1e-9
#: The events tried per direction: the texts at least this many times as frequent (add-one
#: smoothed) in one world's choosing half as in the other's. 1 takes every text seen more
#: often; 3 only the strongly favoured ones, so that a common text seen slightly more often
#: by chance does not dilute a rare leaking one.
RATIOS = (1.0, 3.0)


def positions(max_tokens: int) -> list[int]:
    """The probed prefix lengths: the first token, the second, and the whole answer."""
    return sorted({t for t in (1, 2, max_tokens) if 1 <= t <= max_tokens})


def position_test(texts: Mapping[int, Sequence[str]], bound: float, alpha: float) -> PositionRow:
    """One position's test of the module docstring: ``texts[w]`` are world ``w``'s released
    texts in request order; ``bound`` the log-ratio no set of them may exceed; ``alpha`` this
    position's share of the family-wise error. Returns the larger direction's figure."""
    conf = 1.0 - alpha / (4 * len(RATIOS))  # directions x events x two intervals
    best: PositionRow = {"epsilon_lower": 0.0, "direction": None}
    for a, b in ((1, 0), (0, 1)):
        chose_a, chose_b = Counter(texts[a][0::2]), Counter(texts[b][0::2])
        n_a, n_b = len(texts[a][0::2]) + 1, len(texts[b][0::2]) + 1
        for r in RATIOS:
            event = {
                y
                for y in chose_a
                if chose_a[y] > chose_b.get(y, 0)
                and (chose_a[y] + 1) / n_a >= r * (chose_b.get(y, 0) + 1) / n_b
            }
            test_a, test_b = texts[a][1::2], texts[b][1::2]
            ka, kb = sum(y in event for y in test_a), sum(y in event for y in test_b)
            low = clopper_pearson_lower(ka, len(test_a), conf)
            high = clopper_pearson_upper(kb, len(test_b), conf)
            eps = math.log(low / high) if low > 0 and high > 0 else 0.0
            if best.get("direction") is None or eps > best.get("epsilon_lower", 0.0):
                best = {
                    "direction": f"C{a} over C{b}",
                    "epsilon_lower": max(eps, 0.0),
                    "event_texts": len(event),
                    "event_ratio": r,
                    "counts": [ka, len(test_a), kb, len(test_b)],
                }
    best["bound"] = bound
    best["exceeds"] = best.get("epsilon_lower", 0.0) > bound * (1 + _SLACK)
    return best


async def audit_positions(
    target: AuditTarget,
    bodies: Callable[[int, int], ContextBody],
    query: str,
    *,
    max_tokens: int,
    per_token: PerToken,
    per_world: int = PER_WORLD,
    alpha: float = ALPHA,
) -> PositionsSection | None:
    """The probe of the module docstring; ``bodies(world, answers)`` a context body of that
    world budgeted for ``answers`` answers; ``per_token`` the per-token bound from the
    contexts' records. None where the target cannot generate."""
    if not isinstance(target, GenerationTarget):
        return None
    probed = positions(max_tokens)
    ids: dict[int, str] = {}
    infos: list[ContextInfo] = []
    texts: dict[int, dict[int, list[str]]] = {t: {1: [], 0: []} for t in probed}
    refused: list[str] = []
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(world: int, t: int) -> str | None:
        async with gate:
            try:
                out = await target.generate(ids[world], query, max_tokens=t)
            except TargetError as exc:
                refused.append(f"C{world} max_tokens {t}: {exc}")
                return None
        return str(out.get("text", ""))

    try:
        for world in (1, 0):
            body = bodies(world, per_world * len(probed)).copy()
            body["name"] = f"{body.get('name')} positions"
            info = context_info(await target.create_context(body))
            ids[world] = info["id"]
            infos.append(info)
        for t in probed:
            for world in (1, 0):
                got = await asyncio.gather(*(one(world, t) for _ in range(per_world)))
                texts[t][world] = [g for g in got if g is not None]
    finally:
        for cid in ids.values():
            with contextlib.suppress(TargetError):
                await target.delete_context(cid)
    bound = per_token(infos)
    if bound is None:
        return {
            "status": "unchecked",
            "message": "the probe's contexts report no max_log_ratio (not the proven mode)",
        }
    found: list[PositionRow] = []
    for t in probed:
        if min(len(texts[t][w]) for w in (1, 0)) < per_world // 2:
            continue  # mostly refused: said below
        row = position_test(texts[t], t * bound, alpha / len(probed))
        found.append({"position": t, **row})
    out: PositionsSection = {
        "per_world": per_world,
        "per_token_epsilon": bound,
        "alpha": alpha,
        "positions": found,
        "status": "ok",
        "message": "",
    }
    bad = [f for f in found if f["exceeds"]]
    if bad:
        worst = max(bad, key=lambda f: f["epsilon_lower"] - f["bound"])
        out["status"] = "violation"
        out["message"] = (
            f"VIOLATION: the first {worst['position']} token(s) of DPS-MOZO answers tell "
            f"the neighbouring contexts apart beyond the per-token bound: epsilon >= "
            f"{worst['epsilon_lower']:.3g} ({worst['direction']}, held-out counts "
            f"{worst['counts']}) against {worst['position']} x per_token_epsilon = "
            f"{worst['bound']:.3g} (per_token_epsilon 4 x eps0 reported)"
        )
    elif refused and len(found) < len(probed):
        out["status"] = "nonconforming"
        out["message"] = (
            "NONCONFORMING: requests within the position probe's budget were not answered: "
            + "; ".join(refused[:3])
        )
    else:
        out["status"] = "ok"
        top = max((f["epsilon_lower"] for f in found), default=0.0)
        out["message"] = (
            f"positions {probed}: no prefix of an answer tells the worlds apart beyond "
            f"t x per_token_epsilon {bound:.3g} (largest lower bound {top:.3g})"
        )
    return out


_RANK = {"bug": 3, "violation": 2, "nonconforming": 1}


def with_positions(
    surface: SurfaceSection | None, found: PositionsSection | None
) -> SurfaceSection | None:
    """The surface probe's result with the position probe's under ``positions``; the
    positions' finding decides the status where it is the graver one."""
    if found is None:
        return surface
    out: SurfaceSection = (
        {"status": "ok", "message": "", "routes": []} if surface is None else surface.copy()
    )
    out["positions"] = found
    mine = _RANK.get(str(found.get("status")), 0)
    if mine > _RANK.get(str(out.get("status")), 0):
        out["status"], out["message"] = found["status"], str(found["message"])
    return out
