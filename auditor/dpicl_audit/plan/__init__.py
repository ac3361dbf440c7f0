"""Audit plans: everything one audit needs (any mechanism), validated once.

==================  ===============================================================
module              what it holds
==================  ===============================================================
:mod:`.sources`     where plans come from (a TOML file, CLI flags on top of it, the
                    JSON stored with a run) as data, and the mask of stored tokens
:mod:`.specs`       the plan's sections and the names their fields take
:mod:`.model`       :class:`~.model.AuditPlan`: the sections together, cross-checked
==================  ===============================================================

Everything a caller needs is re-exported here (``from dpicl_audit.plan import AuditPlan``);
the modules of this package import each other directly.
"""

from __future__ import annotations

from dpicl_audit.plan.model import AuditPlan
from dpicl_audit.plan.sources import MASK
from dpicl_audit.plan.specs import (
    Attack,
    BootstrapSpec,
    Calibration,
    CanaryKind,
    DeploymentSpec,
    EmbeddingSource,
    GenerationSpec,
    MechanismName,
    MechanismSpec,
    MozoSpec,
    NeighbourSpec,
    RdpAttack,
    Setting,
    TargetApi,
    TargetSpec,
    ThreatModel,
    VotingDesign,
)

__all__ = [
    "MASK",
    "Attack",
    "AuditPlan",
    "BootstrapSpec",
    "Calibration",
    "CanaryKind",
    "DeploymentSpec",
    "EmbeddingSource",
    "GenerationSpec",
    "MechanismName",
    "MechanismSpec",
    "MozoSpec",
    "NeighbourSpec",
    "RdpAttack",
    "Setting",
    "TargetApi",
    "TargetSpec",
    "ThreatModel",
    "VotingDesign",
]
