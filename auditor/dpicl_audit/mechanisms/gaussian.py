"""What the Gaussian mechanisms' audits share (voting and ESA): a partitioned context with a
seed and a reported noise sigma, budgeted for the queries the audit plans, and the part of a
setting's facts (epsilon_theory, sigma, the server's exact epsilon) they report alike."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dpicl_audit.catalog.settings import GaussianSettings
from dpicl_audit.client import ContextBody
from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.estimators.composition import answers_in_budget, budget_for
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.mechanisms.base import MechanismAudit, exemplar_dicts
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.budgets import budget_limit, context_capacity, planned_answers
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.store import ContextRecord
from dpicl_audit.verdicts.claims import sigma_of

__all__ = [
    "GaussianMechanismAudit",
    "check_partition_seed",
    "gaussian_setting_meta",
]


def check_partition_seed(info: Mapping[str, Any], design: Any) -> None:
    """Refuse a partitioned context whose seed is not the design's (voting, ESA)."""
    seed = info["mechanism"].get("partition_seed")
    if seed is not None and int(seed) != design.partition_seed:
        raise TargetProtocolError(
            f"context {info.get('id')} has partition_seed {seed}, the audit asked for "
            f"{design.partition_seed}: the neighbours would not differ in one partition"
        )


def gaussian_setting_meta(
    plan: AuditPlan, epsilon: float, contexts: Mapping[tuple[str, int], ContextRecord]
) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """The part of a Gaussian mechanism's per-epsilon facts that voting and ESA share;
    with C1's mechanism record (None before contexts exist)."""
    setting = plan.setting_key(epsilon)
    c1, c0 = contexts.get((setting, 1)), contexts.get((setting, 0))
    meta: JsonObject = {
        "setting": setting,
        "epsilon_theory": epsilon,
        "delta": plan.mechanism.delta,
        "partitions": GaussianSettings.of(plan).partitions,
        "calibration": GaussianSettings.of(plan).calibration,
        "context_ids": {"C1": c1.context_id if c1 else None, "C0": c0.context_id if c0 else None},
        "sigma": None,
        "epsilon_exact": None,
        "epsilon_exact_server": None,
    }
    if c1 is None:
        return meta, None
    mech = c1.info.get("mechanism", {})
    meta["sigma"] = sigma_of(c1.info)
    meta["sensitivity"] = mech.get("sensitivity")
    meta["epsilon_exact_server"] = mech.get("epsilon_exact")
    return meta, mech


class GaussianMechanismAudit(MechanismAudit):
    """What voting and ESA share: a partitioned context with a seed and a reported sigma."""

    def queries_per_context(self, plan: AuditPlan) -> int | None:
        # A world whose trials need more budget than a server takes is spread over several
        # identical contexts (slots), each budgeted for its share (ESA learns its signal
        # embeddings from the first pair: learns_from_contexts).
        return self.context_capacity(plan)

    def check_context(self, info: Mapping[str, Any], design: Any, epsilon: float) -> None:
        super().check_context(info, design, epsilon)
        sigma_of(info)
        check_partition_seed(info, design)

    def ingredients(self, design: Any, plan: AuditPlan) -> Ingredients:
        """Contexts held by budgets composed as mu-GDP answers (:meth:`answers_budget`), the
        claim read as a setting's own claim check reads it (the calibration scan), and the
        design's query (the ledger's and the parameters' probes ask the membership one)."""
        kit = super().ingredients(design, plan)
        delta, limit = plan.mechanism.delta, kit.limit

        def hold(body: ContextBody, epsilon: float, answers: int) -> ContextBody | None:
            budget = self.answers_budget(plan, epsilon, answers)
            return None if budget is None else body | {"budget": budget}

        def claim(epsilon: float, info: Mapping[str, Any]) -> Mapping[str, Any]:
            setting = plan.setting_key(epsilon)
            c1 = ContextRecord(setting, 1, epsilon, str(info["id"]), info)
            return self.setting_meta(plan, design, epsilon, {(setting, 1): c1})

        return replace(
            kit,
            hold=hold,
            claim=claim,
            capacity=lambda epsilon: answers_in_budget(epsilon, delta, limit),
            query=getattr(design, "query", None),
            membership=getattr(design, "attack", None) == "inquery",
            gaussian=True,
            answer_tokens=plan.mechanism.answer_tokens,
        )

    def answers_budget(
        self, plan: AuditPlan, epsilon: float, answers: int
    ) -> dict[str, float] | None:
        """A budget that holds ``answers`` answers at ``epsilon`` as this mechanism's
        answers compose (mu-GDP for the Gaussian mechanism); None beyond the server's
        published limit. A mechanism that composes otherwise overrides it."""
        return budget_for(epsilon, plan.mechanism.delta, answers, budget_limit(plan))

    def check_pair(self, setting: str, c1: ContextRecord, c0: ContextRecord) -> None:
        s1, s0 = sigma_of(c1.info), sigma_of(c0.info)
        if not math.isclose(s1, s0, rel_tol=1e-9):
            raise TargetProtocolError(
                f"C1 and C0 of {setting} report different sigma ({s1} and {s0}); the "
                "neighbouring contexts must share one mechanism"
            )

    def base_body(
        self, design: Any, plan: AuditPlan, epsilon: float, world: int, *, name: str
    ) -> ContextBody:
        """The body fields voting and ESA share."""
        mech = GaussianSettings.of(plan)
        return {
            "name": name,
            "task": self.task,
            "exemplars": exemplar_dicts(design.exemplars(world)),
            "mechanism": {
                "name": self.name,
                "epsilon": float(epsilon),
                "delta": mech.delta,
                "partitions": mech.partitions,
                "partition_seed": design.partition_seed,
                "partitioning": "positional",
                "calibration": mech.calibration,
                "temperature": mech.temperature,
            },
            # Budgeted for the queries the audit plans here (ledger.budget_for), so a server
            # in production configuration (no DPICL_ALLOW_UNBUDGETED) can be audited.
            "budget": self.context_budget(plan, epsilon, world),
        }

    def context_budget(
        self, plan: AuditPlan, epsilon: float, world: int
    ) -> dict[str, float] | None:
        """The ``budget`` of a context: the planned answers composed as mu-GDP answers (the
        Gaussian mechanism's own composition); None (unbudgeted) past the largest budget the
        server takes (budgets.budget_limit)."""
        answers = self.planned_answers(plan, epsilon, world)
        return budget_for(epsilon, plan.mechanism.delta, answers, budget_limit(plan))

    def planned_answers(self, plan: AuditPlan, epsilon: float, world: int) -> int:
        """The answers one context of ``world`` at ``epsilon`` is budgeted for."""

        return planned_answers(plan, epsilon, world, self.queries_per_context(plan))

    @staticmethod
    def context_capacity(plan: AuditPlan) -> int | None:
        """Trials per context where a world's need more than one budget (within the server's
        limit) holds."""

        return context_capacity(plan)

    @staticmethod
    def neighbour_summary(design: Any) -> JsonObject:
        """The design facts voting and ESA report alike."""
        return {
            "attack": design.attack,
            "canary_kind": design.canary_kind,
            "canary": design.canary.input,
            "canary_label": design.canary.output,
            "position": design.position,
            "partition_seed": design.partition_seed,
        }
