"""Context adoption is checked by settings, not only by name (dpicl_audit.pipeline.contexts)."""

from __future__ import annotations

from typing import Any

from dpicl_audit.datasets import load_dataset
from dpicl_audit.mechanisms.registry import MECHANISMS
from dpicl_audit.pipeline.contexts import fingerprint, mismatches
from dpicl_audit.plan import AuditPlan


def _body(name: str, **mech: Any) -> dict[str, Any]:
    plan = AuditPlan.from_mapping({"mechanism": {"name": name, **mech}})
    audit = MECHANISMS[name]
    design = audit.build_design(plan, load_dataset(plan.dataset))
    return audit.context_body(design, plan, plan.mechanism.epsilons[0], 1, name="x")


def test_fingerprint_ignores_the_name_and_sees_every_setting() -> None:
    body = _body("voting")
    assert fingerprint(body) == fingerprint(body | {"name": "another"})
    changed = body | {"mechanism": body["mechanism"] | {"temperature": 0.5}}
    assert fingerprint(changed) != fingerprint(body)
    c0 = _body("voting") | {"exemplars": body["exemplars"][::-1]}
    assert fingerprint(c0) != fingerprint(body)


def test_an_adopted_context_must_match_field_by_field() -> None:
    for name in MECHANISMS:
        body = _body(name)
        info = {
            "id": "ctx_1",
            "task": body["task"],
            "n_exemplars": len(body["exemplars"]),
            "mechanism": dict(body["mechanism"]) | {"sigma": 1.0},
        }
        if name == "esa":
            info["mechanism"]["sensitivity"] = 0.5  # the server reports the number
        assert mismatches(info, body) == [], name
        wrong = info | {"mechanism": info["mechanism"] | {"epsilon": 99.0}}
        assert any("mechanism.epsilon" in m for m in mismatches(wrong, body)), name
        short = info | {"n_exemplars": 1}
        assert any("n_exemplars" in m for m in mismatches(short, body)), name
