"""The auditor's half of Laplace-noise private voting, a mechanism added from outside.

The server's ``laplace-voting`` (``server.py`` beside this file) is private voting (paper 000,
Algorithm 2) with Laplace noise instead of Gaussian: each of the label counts gets
``Lap(b)``, ``b = 2 / epsilon``. Replacing one exemplar changes one partition's vote, so two
counts by 1 each: L1 sensitivity 2, and the noisy histogram is the Laplace mechanism, pure
``epsilon``-DP (Dwork and Roth, Theorem 3.6); the released argmax can only leak less.

This audit is voting's (:class:`~dpicl_audit.mechanisms.voting.audit.VotingAudit`: the same
neighbours, context bodies, queries, trials and decision rules) with the noise model changed:

* ``epsilon_theory`` is the claimed epsilon (pure DP: no delta in the claim);
* ``epsilon_exact`` is the exact epsilon at the plan's delta of the design's signal, the two
  counts that change, each a Laplace mechanism of sensitivity 1 and scale ``b``, composed
  (dp-accounting's PLD accountant, independent of the server's arithmetic);
* ``epsilon_emp`` is the classical (assumption-free) lower bound: the GDP figure assumes a
  Gaussian trade-off, which a Laplace mechanism does not have. Above the claim it is a
  VIOLATION, above the exact epsilon a BUG.

Its settings are its own (:mod:`.audit_settings`: partitions, shots, temperature; no
Gaussian calibration), and so is its context body; a white-box trial logs the Laplace
``scale`` the server reports beside the noisy votes (never a Gaussian sigma). There is no
bootstrap (the voting bootstrap resamples with Gaussian noise). Registered through its
settings, the entry point ``laplace-voting =
"laplace_voting.audit_settings:LaplaceVotingSettings"`` of the group
``dpicl_audit.mechanisms``, whose ``audit`` names :data:`LAPLACE_VOTING`; nothing inside
``dpicl_audit`` names it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import dp_accounting
from dp_accounting.pld import PLDAccountant
from scipy import stats

from dpicl_audit.claims import SettingClaims, number
from dpicl_audit.client import ContextBody
from dpicl_audit.context_info import ContextInfo
from dpicl_audit.errors import InvalidAuditInput, TargetProtocolError
from dpicl_audit.estimators.composition import composed_epsilon
from dpicl_audit.jsontypes import JsonObject, JsonValue
from dpicl_audit.mechanisms.base import MechanismAudit, SettingRows, TrialAt, exemplar_dicts
from dpicl_audit.mechanisms.gaussian import check_partition_seed
from dpicl_audit.mechanisms.trial_estimates import estimate_trials
from dpicl_audit.mechanisms.voting.audit import VotingAudit, white_box_votes
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.budgets import budget_limit
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.store import ContextRecord
from dpicl_audit.verdicts import Verdict, for_the_family, verdict
from laplace_voting.audit_settings import CHANGED_COUNTS, LaplaceVotingSettings, laplace_scale

__all__ = ["LAPLACE_VOTING", "LaplaceVotingAudit", "laplace_epsilon_exact", "laplace_scale"]


def laplace_epsilon_exact(scale: float, delta: float) -> float:
    """epsilon at ``delta`` of two counts that change by 1, each with ``Lap(scale)`` noise."""
    if not (scale > 0 and math.isfinite(scale)):
        raise InvalidAuditInput(f"the Laplace scale must be a finite number > 0, got {scale!r}")
    accountant = PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=scale), CHANGED_COUNTS)
    return max(0.0, float(accountant.get_epsilon(delta)))


def _check_scale(got: float, epsilon: float, where: object) -> float:
    want = laplace_scale(epsilon)
    if not math.isclose(got, want, rel_tol=1e-9):
        raise TargetProtocolError(
            f"context {where} reports Laplace scale {got}, the audit expects "
            f"2 / epsilon = {want} at epsilon {epsilon}"
        )
    return want


def _scale_of(info: ContextInfo, epsilon: float) -> float:
    """The scale the context reports (``mechanism.scale``), which must be ``2 / epsilon``;
    ``2 / epsilon`` where it reports none."""
    # This mechanism's own key, beyond the ones the auditor's MechanismInfo names.
    mech: Mapping[str, object] = info.get("mechanism") or {}
    got = number(mech.get("scale"))
    if got is not None:
        return _check_scale(float(got), epsilon, info.get("id"))
    return laplace_scale(epsilon)


@dataclass(frozen=True)
class LaplaceFacts:
    """This mechanism's own facts of a setting: T partitions, the Laplace noise's scale and
    the design's layout."""

    partitions: int
    scale: float
    design: str

    def to_json(self) -> JsonObject:
        return {
            "partitions": self.partitions,
            "noise": "laplace",
            "scale": self.scale,
            "design": self.design,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> LaplaceFacts:
        return cls(
            int(number(data.get("partitions")) or 0),
            float(number(data.get("scale")) or 0.0),
            str(data.get("design")),
        )


class LaplaceVotingAudit(VotingAudit):
    """Private voting with Laplace noise: voting's audit with the Laplace noise model."""

    name = "laplace-voting"
    settings = LaplaceVotingSettings
    has_bootstrap = False

    def check_context(self, info: ContextInfo, design: Any, epsilon: float) -> None:
        # Voting's checks without the Gaussian one (a reported sigma): the Laplace scale.
        MechanismAudit.check_context(self, info, design, epsilon)
        _scale_of(info, epsilon)
        check_partition_seed(info, design)

    def check_pair(self, setting: str, c1: ContextRecord, c0: ContextRecord) -> None:
        s1, s0 = (_scale_of(c.info, c.epsilon) for c in (c1, c0))
        if not math.isclose(s1, s0, rel_tol=1e-9):
            raise TargetProtocolError(f"C1 and C0 of {setting} differ in Laplace scale")

    def context_body(
        self, design: Any, plan: AuditPlan, epsilon: float, world: int, *, name: str
    ) -> ContextBody:
        # Its own settings: T partitions, a seed, a temperature; pure epsilon-DP, so no
        # delta and no Gaussian calibration.
        mech = LaplaceVotingSettings.of(plan)
        body: ContextBody = {
            "name": name,
            "task": self.task,
            "exemplars": exemplar_dicts(design.exemplars(world)),
            "labels": list(design.labels),
            "mechanism": {
                "name": self.name,
                "epsilon": float(epsilon),
                "partitions": mech.partitions,
                "partition_seed": design.partition_seed,
                "partitioning": "positional",
                "temperature": mech.temperature,
            },
            "budget": self.context_budget(plan, epsilon, world),
        }
        if design.template is not None:
            body["template"] = design.template
        return body

    def white_box_observation(self, out: Mapping[str, Any], at: TrialAt) -> dict[str, Any]:
        # The votes as voting's, with the Laplace scale the server reports in place of a
        # Gaussian sigma (checked against 2 / epsilon where the server gives one).
        observation = white_box_votes(out, at)
        observation.pop("sigma", None)
        scale = out.get("scale")
        if scale is not None and at.epsilon is not None:
            _check_scale(float(scale), at.epsilon, at.context.context_id)
        observation["scale"] = scale
        return observation

    def answers_budget(
        self, plan: AuditPlan, epsilon: float, answers: int
    ) -> dict[str, float] | None:
        # The answers must fit however the server composes pure epsilon-DP answers:
        # basic composition (answers x epsilon), or as mu-GDP with mu = 2 Phi^-1(e^eps /
        # (1 + e^eps)) (Dong, Roth and Su 2022, Corollary 2.13: epsilon-DP implies that
        # mu-GDP, exactly for randomized response), which is the looser of the two for few
        # answers. The budget is the larger, so neither accounting refuses a planned answer.
        # How many answers one context holds, so how a world's trials are spread over
        # identical contexts (slots), follows from this (GaussianMechanismAudit.answers_held).
        delta = plan.mechanism.delta
        mu = 2.0 * float(stats.norm.ppf(math.exp(epsilon) / (1.0 + math.exp(epsilon))))
        total = max(answers * epsilon, composed_epsilon(mu, answers, delta)) * (1.0 + 1e-6)
        # Within the largest budget the server takes (its published limit, as the run read it).
        return None if total > budget_limit(plan) else {"epsilon": total, "delta": delta}

    def ingredients(self, design: Any, plan: AuditPlan) -> Ingredients:
        # The ledger's sequential probe expects Gaussian answers composed as mu-GDP
        # (probes.ledger); not this mechanism's.
        return replace(super().ingredients(design, plan), gaussian=False)

    def setting_claims(
        self,
        plan: AuditPlan,
        design: Any,
        epsilon: float,
        contexts: Mapping[tuple[str, int], ContextRecord],
    ) -> SettingClaims:
        setting = plan.setting_key(epsilon)
        c1, c0 = contexts.get((setting, 1)), contexts.get((setting, 0))
        scale = laplace_scale(epsilon)
        return SettingClaims(
            setting=setting,
            epsilon_theory=epsilon,
            delta=plan.mechanism.delta,
            context_ids={"C1": c1.context_id if c1 else None, "C0": c0.context_id if c0 else None},
            epsilon_exact=laplace_epsilon_exact(scale, plan.mechanism.delta),
            facts=LaplaceFacts(LaplaceVotingSettings.of(plan).partitions, scale, design.layout),
        )

    def claims_from_json(self, data: Mapping[str, JsonValue]) -> SettingClaims:
        return SettingClaims.from_json(data, LaplaceFacts.from_json)

    def estimate(self, s: SettingRows) -> SettingResult:
        if s.bootstrap:
            raise InvalidAuditInput("laplace-voting has no bootstrap audit; use a run")
        calls = self.calls_per_query(s.plan)
        return estimate_trials(
            s.plan, s.k, s.rows, s.claims, calls_per_query=calls, finish=_pure_dp
        )


def _pure_dp(est: Estimate, claims: SettingClaims) -> Estimate:
    """epsilon_emp = the classical lower bound, read against the claim and the exact epsilon;
    a VIOLATION or BUG holds for the run's tests together (verdicts.for_the_family)."""
    theory, exact = claims.epsilon_theory, claims.epsilon_exact

    def judge(classical: float) -> Verdict:
        return verdict(max(classical, 0.0), theory, exact)

    classical = float(est.get("epsilon_lower_classic"))
    est = est.updated(epsilon_emp=max(classical, 0.0), epsilon_emp_basis="classical")
    found = for_the_family(
        judge(classical), est, claims, lambda fw: judge(fw.epsilon_lower_classic)
    )
    return est.updated(verdict=found)


LAPLACE_VOTING = LaplaceVotingAudit()
