"""Audit plans: everything one audit needs (any mechanism), validated once.

==================  ===============================================================
module              what it holds
==================  ===============================================================
:mod:`.sources`     where plans come from (a TOML file, CLI flags on top of it, the
                    JSON stored with a run) as data, and the mask of stored tokens
:mod:`.specs`       the plan's sections and the names their fields take
:mod:`.model`       :class:`~.model.AuditPlan`: the sections together, cross-checked
:mod:`.schedule`    what a plan implies for its trials: run ids, each trial's world,
                    the random streams of a run, the contexts a world is spread over
:mod:`.budgets`     the plan's budgets: answers per context, contexts per world, the
                    server's published limit
:mod:`.deployment`  a deployed context's own epsilon, delta and partitions in the plan
==================  ===============================================================

The plan itself is re-exported here (``from dpicl_audit.plan import AuditPlan``); the
modules of this package import each other directly, and :mod:`.schedule`, :mod:`.budgets`
and :mod:`.deployment` are imported by their own paths (nothing of the plan needs them).
"""

from __future__ import annotations

from dpicl_audit.plan import specs
from dpicl_audit.plan.model import AuditPlan
from dpicl_audit.plan.sources import MASK
from dpicl_audit.plan.specs import *  # noqa: F403

__all__ = ["MASK", "AuditPlan", *specs.__all__]
