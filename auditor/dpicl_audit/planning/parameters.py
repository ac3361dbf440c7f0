"""Vary what a client controls (issue 35, item 2, in part): the OpenAI chat route's sampling
parameters must not change the release.

dpicl's chat route accepts ``temperature`` and ``top_p`` and ignores them (the noise and the
votes are the context's); a server may also refuse them. A server that lets them reach the
noise (e.g. noise scaled by the client's temperature: at ``temperature: 0`` the majority label
comes back every time) releases the un-noised answer to any client who asks. So, after the
trials, a fresh context of the run's C1 body at the plan's first epsilon (budgeted for the
sweep) is asked the audit query :data:`PER_VARIANT` times through ``/v1/chat/completions``
with each variant of :data:`VARIANTS` (no parameter, temperature 0, 1 and 2, top_p 0.1,
max_tokens 1). A variant the server refuses (a 4xx naming it) is fine. The labels of the
answered variants must come from one distribution: the chi-square test of homogeneity of the
variants x labels table (scipy.stats.chi2_contingency), p below :data:`ALPHA` (1e-4: a correct
server is flagged in at most 1 run in 10,000) is NONCONFORMING (exit 4) and names the variant
whose labels depart most from the no-parameter answers. The result is ``results["parameters"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats

from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.errors import TargetError, TargetNotFound, TargetRejected
from dpicl_audit.planning.ledger import planned_queries
from dpicl_audit.planning.sections import ParametersSection, ParameterVariant

__all__ = ["ALPHA", "PER_VARIANT", "VARIANTS", "sweep_parameters"]

#: Error of the homogeneity test (a correct server is flagged in at most this share of runs).
ALPHA = 1e-4
#: Answers asked per variant.
PER_VARIANT = 60
#: The client parameters swept (name, the chat body's extra fields).
VARIANTS: tuple[tuple[str, dict[str, float]], ...] = (
    ("no parameter", {}),
    ("temperature 0", {"temperature": 0}),
    ("temperature 1", {"temperature": 1}),
    ("temperature 2", {"temperature": 2}),
    ("top_p 0.1", {"top_p": 0.1}),
    ("max_tokens 1", {"max_tokens": 1}),
)
_CHAT = "/v1/chat/completions"


async def _ask(target: Any, cid: str, query: str, extra: Mapping[str, Any]) -> str:
    body = {"model": cid, "messages": [{"role": "user", "content": query}], **extra}
    out = await target.post(_CHAT, body)
    return str(out["choices"][0]["message"]["content"])


#: The answers a sweep asks for: what its context's budget must hold.
SWEEP_ANSWERS = planned_queries(PER_VARIANT * len(VARIANTS))


async def sweep_parameters(
    target: AuditTarget,
    body: ContextBody,
    query: str,
    *,
    budget: dict[str, float] | None,
) -> ParametersSection | None:
    """The sweep of the module docstring on a fresh context of ``body`` (a voting context
    body) with ``budget``, which holds :data:`SWEEP_ANSWERS` answers as the mechanism's
    audit composes them (None: no budget within the server's limit does); None where the
    target cannot send chat requests."""
    if not hasattr(target, "post"):
        return None
    if budget is None:
        return {"status": "unchecked", "message": "no budget within the server's limit holds it"}
    probe = body.copy()
    probe["name"], probe["budget"] = f"{body['name']} parameters", budget
    info = await target.create_context(probe)
    cid = str(info["id"])
    variants: list[ParameterVariant] = []
    try:
        for name, extra in VARIANTS:
            try:
                labels = await asyncio.gather(
                    *(_ask(target, cid, query, extra) for _ in range(PER_VARIANT))
                )
            except TargetNotFound:
                if not extra:
                    return {"status": "unchecked", "message": f"the server has no {_CHAT}"}
                variants.append({"variant": name, "refused": True})
                continue
            except TargetRejected as exc:
                variants.append({"variant": name, "refused": True, "message": str(exc)})
                continue
            counts: dict[str, int] = {}
            for lab in labels:
                counts[lab] = counts.get(lab, 0) + 1
            variants.append({"variant": name, "refused": False, "labels": counts})
    finally:
        with contextlib.suppress(TargetError):
            await target.delete_context(cid)
    return _judge(variants)


def _judge(variants: list[ParameterVariant]) -> ParametersSection:
    answered = [v for v in variants if not v["refused"]]
    names = sorted({lab for v in answered for lab in v.get("labels", {})})
    out: ParametersSection = {
        "status": "ok",
        "message": "",
        "variants": variants,
        "per_variant": PER_VARIANT,
    }
    if len(answered) < 2 or len(names) < 2:
        out["p_value"] = None
        out["message"] = (
            "every variant released the same label"
            if len(names) < 2 and len(answered) >= 2
            else "fewer than two variants answered: nothing to compare"
        )
        return out
    counts = [v.get("labels", {}) for v in answered]
    table = np.array([[c.get(lab, 0) for lab in names] for c in counts], dtype=float)
    p = float(stats.chi2_contingency(table).pvalue)
    base = table[0] / table[0].sum()
    worst = max(
        range(1, len(answered)),
        key=lambda i: float(np.abs(table[i] / table[i].sum() - base).sum()),
    )
    flagged = p < ALPHA
    rates = ", ".join(
        f"{v['variant']}: {c.get(names[0], 0)}/{PER_VARIANT} {names[0]!r}"
        for v, c in zip(answered, counts, strict=True)
    )
    out["status"], out["p_value"] = "nonconforming" if flagged else "ok", p
    out["variant"] = answered[worst]["variant"]
    out["message"] = (
        f"NONCONFORMING: the client's parameter ({answered[worst]['variant']}) changes the "
        f"released labels (chi-square p = {p:.2g} < {ALPHA:g}; {rates}): it reaches the "
        "mechanism instead of being refused or ignored"
        if flagged
        else f"the client's parameters do not change the release (p = {p:.2g}; {rates})"
    )
    return out
