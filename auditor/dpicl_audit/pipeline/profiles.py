"""Audit profiles: what ``dpicl-audit run --profile`` adds to the plan it is given.

* ``default``: the plan as given (for voting on a simulator: the pivotal design at epsilon
  1, 2, 4 and 8; at 8 the classical calibration's sigma is 0.86 < 1).
* ``verify``: the plan as given, then a *tail-gap* companion run (:func:`tail_plan`): paper
  000's design with T = 3 partitions at epsilon 8, C1's clean votes [1, 2] against C0's
  [0, 3]. The Gaussian noise (sigma 0.86 at epsilon 8) releases C0's positive answer in 0.67%
  of trials; a noise whose tails are bounded (uniform of the claimed variance: |difference|
  <= 2 sqrt(3) sigma = 2.97 < 3) never does, so the release-rate test
  (:mod:`~dpicl_audit.estimators.conformance`) and the classical bound against the design's
  own exact epsilon (BUG) both see it. The pivotal design alone, whose gaps sit where the
  rates are mid-range, does not; every black-box voting run's tail probe does
  (:mod:`dpicl_audit.probes.tails`, docs/auditing.md).
"""

from __future__ import annotations

from typing import Literal

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.plan import AuditPlan

__all__ = [
    "PROFILES",
    "TAIL_EPSILON",
    "TAIL_PARTITIONS",
    "TAIL_TRIALS",
    "Profile",
    "companion_plan",
    "tail_plan",
    "tail_run_id",
    "with_tail_gap",
]

Profile = Literal["default", "verify"]
PROFILES: tuple[Profile, ...] = ("default", "verify")
TAIL_EPSILON = 8.0
TAIL_PARTITIONS = 3
TAIL_TRIALS = 3000


def tail_plan(plan: AuditPlan) -> AuditPlan | None:
    """The ``verify`` profile's companion plan for ``plan``; None where it does not apply
    (a mechanism other than voting, or an attack other than the membership query)."""
    mech = plan.mechanism.tail_gap(TAIL_EPSILON, TAIL_PARTITIONS)
    if mech is None or plan.attack != "inquery" or plan.setting != "audit-template":
        return None
    name = f"{plan.name} (tail gap)" if plan.name else "tail gap"
    return plan.model_copy(
        update={"design": "paper", "mechanism": mech, "trials": TAIL_TRIALS, "name": name}
    )


def companion_plan(profile: str, kind: str, plan: AuditPlan) -> AuditPlan | None:
    """The plan of ``--profile``'s companion run for a ``kind`` command ("run" or
    "bootstrap"); None for none. Refuses an unknown profile and ``verify`` off ``run``."""
    if profile not in PROFILES:
        raise InvalidAuditInput(f"--profile {profile!r}: choose one of {list(PROFILES)}")
    if profile == "default":
        return None
    if kind != "run":
        raise InvalidAuditInput("--profile verify: only for run")
    return tail_plan(plan)


def tail_run_id(run_id: str) -> str:
    """The id of ``run_id``'s tail-gap companion (``dpicl-audit run --profile verify``)."""
    return f"{run_id}-tail"


def with_tail_gap(results: JsonMapping, tail: JsonMapping) -> JsonObject:
    """A ``verify`` run's results as one JSON document: the companion's inside the run's
    (stored with the run: what ``run --profile verify --json`` prints, and ``show`` and the
    run's ``results.json`` again)."""
    return dict(results) | {"verify": {"tail_gap": dict(tail)}}
