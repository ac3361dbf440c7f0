"""DPS-MOZO's trial logs written before the pipeline held every mechanism (before issue 9).

Voting, bootstrap and ESA runs of older versions are read as they are: their plans, designs,
settings and trials have the same shape. Only the old separate DPS-MOZO audit
(``python -m dpicl_audit.mozo_audit``, plan ``{"kind": "mozo-black-box", ...}``) logged
its own shapes; :func:`upgrade_run` (the audit's hook, :meth:`~dpicl_audit.mechanisms.
base.MechanismAudit.upgrade_run`) reads such a run as a completed ``dps-mozo`` pipeline run,
so ``list``, ``show`` and ``report`` treat it like any other. Its design is rebuilt from
its seed (the same draws as the old module), its trials keep their setting ``mozo:eps=<e>``,
and its stored estimate is kept as the run's black-box result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dpicl_audit.datasets import load_dataset
from dpicl_audit.jsontypes import JsonObject, JsonValue, json_object
from dpicl_audit.mechanisms.dps_mozo.design import mozo_design
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import RunRecord

__all__ = ["LEGACY_MOZO_KIND", "is_legacy_mozo", "upgrade_run"]

LEGACY_MOZO_KIND = "mozo-black-box"


def is_legacy_mozo(run: RunRecord) -> bool:
    """A run of the old separate DPS-MOZO audit."""
    return run.plan.get("kind") == LEGACY_MOZO_KIND


def _plan(old: Mapping[str, Any]) -> JsonObject:
    mechanism: JsonObject = {
        "name": "dps-mozo",
        "epsilons": [float(old["epsilon"])],
        "exemplars": int(old["n_exemplars"]),
        "n_shots": int(old["n_shots"]),
        "top_k": int(old["top_k"]),
        "max_tokens": int(old["max_tokens"]),
        "queries_per_context": int(old["queries_per_context"]),
        "guarantee": "paper",  # the only DPS-MOZO mode servers had then
    }
    if old.get("delta") is not None:
        mechanism["delta"] = float(old["delta"])
    if old.get("alpha") is not None:
        mechanism["alpha"] = int(old["alpha"])
    return {
        "target": {"base_url": str(old.get("target") or "http://127.0.0.1:8000")},
        "dataset": "dialogsum-mini",
        "mechanism": mechanism,
        "trials": max(10, int(old["trials"])),
        "confidence": float(old["confidence"]),
        "seed": int(old["seed"]),
        "mozo": {"signals": list(old["signals"])},
    }


def _design(plan: Mapping[str, Any], old: Mapping[str, Any]) -> JsonObject:

    p = AuditPlan.from_mapping(plan)
    design = mozo_design(p, load_dataset(p.dataset)).to_json()
    design["position"] = int(old.get("position", design["position"]))
    return design


def _results(run: RunRecord, plan: Mapping[str, Any], design: Mapping[str, Any]) -> JsonObject:
    old = dict(run.results or {})
    bb = dict(json_object(old.get("black_box")))
    eps = float(plan["mechanism"]["epsilons"][0])
    n = sum(_count(bb.get(k, 0)) for k in ("tp", "fn", "fp", "tn"))
    setting = {
        "setting": f"mozo:eps={eps:g}",
        "epsilon_theory": eps,
        "delta": old.get("delta"),
        "sigma": None,
        "epsilon_exact": None,
        "nominal": True,
        "alpha": old.get("alpha"),
        "beta": old.get("beta"),
        "per_token_bound": old.get("per_token_bound"),
        "trials": n,
        "n_with": bb.get("n_pos"),
        "n_without": bb.get("n_neg"),
        "llm_calls": run.llm_calls,
        "starts_with": old.get("starts_with"),
        "black_box": bb,
        "white_box": None,
    }
    return {
        "run_id": run.id,
        "kind": "run",
        "name": run.name,
        "status": run.status,
        "created_at": run.created_at.isoformat(),
        "plan": plan,
        "versions": run.versions,
        "mechanism": "dps-mozo",
        "design": {
            "attack": "inquery",
            "canary_kind": "signal",
            "canary": design["canary"]["input"],
            "position": design["position"],
            "positive": design["signals"][0],
            "negative": design["signals"][1],
            "query": design["query"],
        },
        "confidence": plan["confidence"],
        "delta": old.get("delta"),
        "threat_models": ["black-box"],
        "settings": [setting],
        "notes": old.get("notes", []),
        "legacy": LEGACY_MOZO_KIND,
        "queries": run.queries,
        "llm_calls": run.llm_calls,
        "wall_time_s": run.wall_time_s,
    }


def _count(value: JsonValue) -> int:
    """A legacy run's confusion count (``int`` as it was read before the results were typed)."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"a legacy black-box count must be a number, got {value!r}")


def upgrade_run(run: RunRecord) -> RunRecord | None:
    """The run as the pipeline reads it; None unless it is a legacy DPS-MOZO run."""
    if not is_legacy_mozo(run):
        return None
    plan = _plan(run.plan)
    design = _design(plan, run.design or {})
    return dataclasses.replace(run, plan=plan, design=design, results=_results(run, plan, design))
