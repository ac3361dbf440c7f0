"""What the Gaussian mechanisms' audits share (voting and ESA): a partitioned context with a
seed and a reported noise sigma, budgeted for the queries the audit plans, and the part of a
setting's claims (epsilon_theory, sigma, the server's exact epsilon) and facts
(:class:`GaussianFacts`) they report alike."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dpicl_audit.catalog.settings import GaussianSettings
from dpicl_audit.claims import SettingClaims, number, sigma_of
from dpicl_audit.client import ContextBody
from dpicl_audit.context_info import ContextInfo
from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.estimators.composition import budget_for, most_that_fit
from dpicl_audit.jsontypes import JsonObject, JsonValue
from dpicl_audit.mechanisms.base import MechanismAudit, exemplar_dicts
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.budgets import budget_limit, context_capacity, planned_answers
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.store import ContextRecord

__all__ = [
    "GaussianFacts",
    "GaussianMechanismAudit",
    "check_partition_seed",
    "gaussian_setting_claims",
]


def check_partition_seed(info: ContextInfo, design: Any) -> None:
    """Refuse a partitioned context whose seed is not the design's (voting, ESA)."""
    seed = info["mechanism"].get("partition_seed")
    if seed is not None and int(seed) != design.partition_seed:
        raise TargetProtocolError(
            f"context {info.get('id')} has partition_seed {seed}, the audit asked for "
            f"{design.partition_seed}: the neighbours would not differ in one partition"
        )


@dataclass(frozen=True)
class GaussianFacts:
    """A Gaussian mechanism's own facts of a setting (voting's; ESA adds its signal's):
    the partitions T, the calibration and the design's layout."""

    partitions: int
    calibration: str
    design: str

    def to_json(self) -> JsonObject:
        return {
            "partitions": self.partitions,
            "calibration": self.calibration,
            "design": self.design,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> GaussianFacts:
        return cls(
            int(number(data.get("partitions")) or 0),
            str(data.get("calibration")),
            str(data.get("design")),
        )


def gaussian_setting_claims(
    plan: AuditPlan,
    epsilon: float,
    contexts: Mapping[tuple[str, int], ContextRecord],
    design: str,
) -> SettingClaims:
    """The claims of a Gaussian mechanism's setting that voting and ESA share: the noise
    sigma, sensitivity and exact epsilon C1 reports (unknown before contexts exist), and
    their facts (``design``: the design's layout)."""
    setting = plan.setting_key(epsilon)
    c1, c0 = contexts.get((setting, 1)), contexts.get((setting, 0))
    mech = GaussianSettings.of(plan)
    claims = SettingClaims(
        setting=setting,
        epsilon_theory=epsilon,
        delta=plan.mechanism.delta,
        context_ids={"C1": c1.context_id if c1 else None, "C0": c0.context_id if c0 else None},
        facts=GaussianFacts(mech.partitions, mech.calibration, design),
        nulls=frozenset({"epsilon_exact_server"}),
    )
    if c1 is None:
        return claims
    reported = c1.info.get("mechanism", {})
    return replace(
        claims,
        sigma=sigma_of(c1.info),
        sensitivity=number(reported.get("sensitivity")),
        epsilon_exact_server=number(reported.get("epsilon_exact")),
        # Written as null where C1 does not report it (the JSON as it always was).
        nulls=claims.nulls | {"sensitivity"},
    )


class GaussianMechanismAudit(MechanismAudit):
    """What voting and ESA share: a partitioned context with a seed and a reported sigma."""

    def claims_from_json(self, data: Mapping[str, JsonValue]) -> SettingClaims:
        return SettingClaims.from_json(data, GaussianFacts.from_json)

    def queries_per_context(self, plan: AuditPlan) -> int | None:
        # A world whose trials need more budget than a server takes is spread over several
        # identical contexts (slots), each budgeted for its share (ESA learns its signal
        # embeddings from the first pair: learns_from_contexts).
        return self.context_capacity(plan)

    def check_context(self, info: ContextInfo, design: Any, epsilon: float) -> None:
        super().check_context(info, design, epsilon)
        sigma_of(info)
        check_partition_seed(info, design)

    def ingredients(self, design: Any, plan: AuditPlan) -> Ingredients:
        """Contexts held by budgets composed as its answers compose (:meth:`answers_budget`,
        :meth:`answers_held`: mu-GDP for the Gaussian mechanism), the claim read as a
        setting's own claim check reads it (the calibration scan), and the design's query
        (the ledger's and the parameters' probes ask the membership one)."""
        kit = super().ingredients(design, plan)

        def hold(body: ContextBody, epsilon: float, answers: int) -> ContextBody | None:
            budget = self.answers_budget(plan, epsilon, answers)
            return None if budget is None else body | {"budget": budget}

        def claim(epsilon: float, info: ContextInfo) -> SettingClaims:
            setting = plan.setting_key(epsilon)
            c1 = ContextRecord(setting, 1, epsilon, info["id"], info)
            return self.setting_claims(plan, design, epsilon, {(setting, 1): c1})

        return replace(
            kit,
            hold=hold,
            claim=claim,
            capacity=lambda epsilon: self.answers_held(plan, epsilon),
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
        published limit. A mechanism that composes otherwise overrides it, and how many
        answers one context holds (:meth:`answers_held`), so how its trials are spread over
        contexts and the retry margin, follow."""
        return budget_for(epsilon, plan.mechanism.delta, answers, budget_limit(plan))

    def answers_held(self, plan: AuditPlan, epsilon: float) -> int:
        """The most answers at ``epsilon`` one context's budget holds: the largest count
        :meth:`answers_budget` gives a budget for (for the Gaussian composition, exactly
        composition.answers_in_budget)."""
        return most_that_fit(lambda n: self.answers_budget(plan, epsilon, n) is not None)

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
        """The ``budget`` of a context: the planned answers composed as this mechanism's
        answers compose (:meth:`answers_budget`); None (unbudgeted) past the largest budget
        the server takes (budgets.budget_limit)."""
        answers = self.planned_answers(plan, epsilon, world)
        return self.answers_budget(plan, epsilon, answers)

    def planned_answers(self, plan: AuditPlan, epsilon: float, world: int) -> int:
        """The answers one context of ``world`` at ``epsilon`` is budgeted for."""

        per_context = self.queries_per_context(plan)
        return planned_answers(plan, epsilon, world, per_context, self._held(plan))

    def context_capacity(self, plan: AuditPlan) -> int | None:
        """Trials per context where a world's need more than one budget (within the server's
        limit, as this mechanism's answers compose) holds."""

        return context_capacity(plan, self._held(plan))

    def _held(self, plan: AuditPlan) -> Callable[[float], int]:
        return lambda epsilon: self.answers_held(plan, epsilon)

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
