"""Audit the deployment's own settings (issue 35, item 5).

Pointed at a deployed context (``deployment.context``: a native context id, or the model id
of an OpenAI-compatible deployment), a run reads that deployment's mechanism settings when it
starts and plans for them: the deployment's epsilon joins the plan's epsilons, and its
partitions and delta replace the plan's defaults. A value the plan sets itself (``--epsilons``,
``--partitions``, ``--delta``, or the TOML file) wins. The plan is stored resolved, so a
resumed run audits what the first start read.

Where the settings come from: the native context record (``GET /v1/contexts/{id}``,
``mechanism``: epsilon, delta, partitions), else the OpenAI model's dpicl extension
(``GET /v1/models/{id}``, ``dpicl``: epsilon and delta; it does not name partitions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpicl_audit.client import AuditTarget
from dpicl_audit.context_info import ContextInfo
from dpicl_audit.errors import InvalidPlan, TargetError, TargetProtocolError
from dpicl_audit.jsontypes import JsonMapping, JsonObject, json_float, json_int
from dpicl_audit.plan.model import AuditPlan

__all__ = ["adopt_deployment", "deployment_settings"]


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


async def deployment_settings(target: AuditTarget, ident: str) -> JsonObject:
    """``{"epsilon", "delta", "partitions"}`` of the deployed context ``ident`` (None where
    the deployment does not report one); raises TargetProtocolError where it reports no
    epsilon."""
    found: JsonObject = {}
    info: ContextInfo | None
    try:
        info = await target.get_context(ident)
    except TargetError:
        info = None
    mech = info.get("mechanism") if info is not None else None
    model = info.get("model") if info is not None else None
    ext = model.get("dpicl") if isinstance(model, Mapping) else None
    if isinstance(mech, Mapping):
        found = {
            "epsilon": mech.get("epsilon"),
            "delta": mech.get("delta"),
            "partitions": mech.get("partitions"),
        }
    elif isinstance(ext, Mapping):
        found = {"epsilon": ext.get("epsilon"), "delta": ext.get("delta")}
    get_model = getattr(target, "get_model", None)
    if _number(found.get("epsilon")) is None and get_model is not None:
        ext = (await get_model(ident)).get("dpicl")
        if isinstance(ext, Mapping):
            found = {"epsilon": ext.get("epsilon"), "delta": ext.get("delta")}
    eps = _number(found.get("epsilon"))
    if eps is None:
        raise TargetProtocolError(
            f"deployment {ident!r} reports no epsilon (neither GET /v1/contexts/{ident} nor "
            f"/v1/models/{ident}): give --epsilons"
        )
    parts = found.get("partitions")
    return {
        "epsilon": eps,
        "delta": _number(found.get("delta")),
        "partitions": int(parts) if isinstance(parts, int) and parts >= 1 else None,
    }


def adopt_deployment(plan: AuditPlan, found: JsonMapping) -> AuditPlan:
    """``plan`` with the deployment's settings where the plan does not set its own (module
    docstring); validated again as a whole."""
    mech = plan.mechanism
    given = mech.model_fields_set
    update: dict[str, object] = {}
    eps = json_float(found["epsilon"])
    if "epsilons" not in given and not any(math.isclose(eps, e) for e in mech.epsilons):
        update["epsilons"] = sorted({*mech.epsilons, eps})
    if "partitions" not in given and found.get("partitions") is not None:
        update["partitions"] = json_int(found["partitions"])
    if "delta" not in given and found.get("delta") is not None:
        update["delta"] = json_float(found["delta"])
    if not update:
        return plan
    data = plan.model_dump()
    data["mechanism"] = data["mechanism"] | update
    try:
        return AuditPlan.from_mapping(data)
    except InvalidPlan as exc:
        raise InvalidPlan(
            f"the deployment's settings {dict(update)} do not fit the plan: {exc} (give "
            "--epsilons, --partitions or --delta to choose)"
        ) from exc
