"""One run's state, held once: what the run's contexts, trials and execution all act on.

:mod:`.contexts`, :mod:`.trials` and :mod:`.runner` each take the run's
:class:`RunContext` instead of keeping their own copies of the trial log, the target, the run
id, the plan, the mechanism's audit and the design; :mod:`.run` makes it, once per life of a
run (``run``, ``bootstrap`` or ``resume``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rich.console import Console

from dpicl_audit.client import AuditTarget
from dpicl_audit.mechanisms.base import MechanismAudit
from dpicl_audit.mechanisms.registry import get_mechanism
from dpicl_audit.plan import AuditPlan
from dpicl_audit.store import TrialStore

__all__ = ["RunContext", "RunKind"]

RunKind = Literal["run", "bootstrap"]


@dataclass(slots=True)
class RunContext:
    """The state of one run against one target.

    ``design`` is the one field that changes: the mechanism may complete it before the trials
    (:meth:`~dpicl_audit.mechanisms.base.MechanismAudit.prepare`, ESA's signal embeddings),
    and every step then reads the completed design from here.
    """

    store: TrialStore
    target: AuditTarget
    run_id: str
    plan: AuditPlan
    design: Any
    kind: RunKind = "run"
    console: Console = field(default_factory=lambda: Console(stderr=True))
    mechanism: MechanismAudit = field(init=False)

    def __post_init__(self) -> None:
        self.mechanism = get_mechanism(self.plan.mechanism.name)
