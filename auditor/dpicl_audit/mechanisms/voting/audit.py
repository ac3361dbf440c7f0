"""Auditing private voting (paper 000, Algorithm 2; audits of Section 3.2 and Appendix B).

* **Neighbours.** C1 and C0 hold ``partitions x shots`` exemplars in the same order with the
  same ``partition_seed`` and differ at one position (:mod:`..neighbours`). Canary kinds:
  ``natural`` (an example with its own label), ``mislabeled`` (another label, drawn),
  ``random`` (made-up words, a random label). Exemplar outputs must be labels of the context
  (the server checks this): in the ``audit-template`` setting the labels are Prompt 1's
  ``Yes``/``No`` and each exemplar's output is a seeded coin (the verification prompt asks
  about the text, not the topic); the canary takes the replacement's output when
  ``natural``, the other one when ``mislabeled``. Brainwash and the ``deployment`` setting
  keep the dataset's own labels.
* **Query.** ``inquery``: Prompt 1 (or, in a deployment, one of two of its labels);
  ``brainwash``: the canary repeated with a wrong label.
* **Observation.** Black-box: the released label; decision 1 when it is the positive answer.
  White-box (``/v1/debug/classify``): the noisy votes; score ``noisy[pos] - noisy[neg]``
  (Brainwash: the margin over the best other label), "present" above a threshold.
* **Exact epsilon.** The Gaussian mechanism with Delta2 = sqrt(2) at the sigma the server
  reports (dp-accounting PLD).
* **Bootstrap.** Clean vote vectors from ``/v1/debug/classify`` at ``internal``, resampled
  with the server's sigma (:mod:`.bootstrap`), after the noise check.

The design is stored with the run, so a resumed run needs neither the dataset nor the seed
logic of the version that started it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import ClassVar

from dpicl_audit.catalog.settings import MechanismSettings
from dpicl_audit.claims import SettingClaims
from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.datasets import LabelledDataset, load_dataset
from dpicl_audit.errors import TargetProtocolError
from dpicl_audit.estimators.extra_fields import response_fields
from dpicl_audit.jsontypes import JsonMapping, JsonObject, JsonValue, json_float
from dpicl_audit.mechanisms.base import SettingRows, TrialAt, ask, needs_internal, require_keys
from dpicl_audit.mechanisms.gaussian import GaussianMechanismAudit, gaussian_setting_claims
from dpicl_audit.mechanisms.voting.build import build_design
from dpicl_audit.mechanisms.voting.design import AuditDesign
from dpicl_audit.mechanisms.voting.estimates import (
    estimate_sequence,
    estimate_votes,
    release_claims,
)
from dpicl_audit.mechanisms.voting.exact import voting_epsilon_exact
from dpicl_audit.mechanisms.voting.rdp import RDP_ATTACKS, RdpDesign, build_rdp_design
from dpicl_audit.mechanisms.voting.settings import VotingSettings
from dpicl_audit.plan import AuditPlan
from dpicl_audit.probes.ingredients import Ingredients, TailContexts
from dpicl_audit.probes.tails import PARTITIONS, START_EPSILON
from dpicl_audit.results import SettingResult
from dpicl_audit.store import ContextRecord, TrialRecord
from dpicl_audit.verdicts import RDP_CUTS

__all__ = ["VOTING", "VotingAudit", "white_box_votes"]


class VotingAudit(GaussianMechanismAudit):
    """Private voting: labels released by a noisy argmax over T partition votes."""

    name = "voting"
    settings: ClassVar[type[MechanismSettings]] = VotingSettings
    task = "classification"
    design_type = AuditDesign
    clean_name = "clean votes"

    def build_design(self, plan: AuditPlan, dataset: LabelledDataset) -> AuditDesign | RdpDesign:
        if plan.attack in RDP_ATTACKS:  # paper 003's adversaries: query sequences
            return build_rdp_design(plan, dataset)
        return build_design(plan, dataset)

    def load_design(self, data: JsonMapping) -> AuditDesign | RdpDesign:
        if data.get("design_kind") == "rdp":
            return RdpDesign.from_json(data)
        return AuditDesign.from_json(data)

    def summary(self, design: AuditDesign | RdpDesign) -> JsonObject:
        return self.neighbour_summary(design) | design.summary_fields()

    def context_body(
        self,
        design: AuditDesign | RdpDesign,
        plan: AuditPlan,
        epsilon: float,
        world: int,
        *,
        name: str,
    ) -> ContextBody:
        body = self.base_body(design, plan, epsilon, world, name=name)
        body["labels"] = list(design.labels)
        if design.template is not None:
            body["template"] = design.template
        return body

    async def trial(
        self, target: AuditTarget, design: AuditDesign | RdpDesign, plan: AuditPlan, at: TrialAt
    ) -> TrialRecord:
        """Trial ``at.index``: the label, and (white-box) the votes and the design's score;
        a paper-003 sequence asks its query ``index mod N``."""
        if isinstance(design, RdpDesign):
            query = design.query_of(at.index)
            out, latency = await ask(target, at, query)
            label = str(out["label"])
            seq_obs: JsonObject = {"label": label, "q": at.index % len(design.queries)}
            if at.white:
                seq_obs |= self.white_box_observation(out, at)
            return at.record(query, seq_obs, int(label == design.poison_label), latency)
        out, latency = await ask(target, at, design.query)
        label = str(out["label"])
        observation: JsonObject = {"label": label}
        score: float | None = None
        if not at.white:
            # Every field besides the answer (issue 35): logged where a response has any
            # that is not public by design, and tested for dependence on the world.
            whole = out.get("response")
            fields = response_fields(whole if isinstance(whole, Mapping) else out)
            if fields:
                observation["fields"] = fields
        if at.white:
            observation |= self.white_box_observation(out, at)
            try:
                score = design.score(observation["noisy_votes"])
            except KeyError as exc:
                raise TargetProtocolError(f"/v1/debug/classify: {exc.args[0]}") from exc
        return at.record(design.query, observation, design.decide_label(label), latency, score)

    def white_box_observation(self, out: JsonMapping, at: TrialAt) -> JsonObject:
        """What a white-box trial logs of ``/v1/debug/classify`` (:func:`white_box_votes`;
        a variant with other noise logs its own parameters)."""
        return white_box_votes(out, at)

    def ingredients(self, design: AuditDesign | RdpDesign, plan: AuditPlan) -> Ingredients:
        """The Gaussian mechanisms' ingredients, with the probes' query only for the
        membership query of one-query designs (paper 003's sequences and the other attacks
        leave the ledger, the sweep, the surface and the tails out), and the tail probe's
        contexts (:func:`tail_contexts`)."""
        kit = super().ingredients(design, plan)
        if isinstance(design, RdpDesign) or design.attack != "inquery":
            return replace(kit, query=None, membership=False)
        # The tail probe's premise is the Gaussian claim: a variant with other noise
        # (settings without a tail-gap design, e.g. examples/laplace_voting) has none.
        if plan.setting != "audit-template" or plan.mechanism.tail_gap(1.0, 1) is None:
            return kit
        return replace(kit, tail_contexts=functools.partial(self.tail_contexts, plan))

    def tail_contexts(self, plan: AuditPlan) -> TailContexts:
        """Paper 000's C0 at an epsilon and T partitions of one exemplar, whatever the run's
        layout (a real engine's run uses the identical design, with made-up labels): Prompt
        1's Yes/No, C0 holding no copy of the text (probes.tails)."""
        dataset = load_dataset(plan.dataset)

        @functools.cache  # one design per (epsilon, T), however many contexts it makes
        def probe_design(epsilon: float, partitions: int) -> tuple[AuditPlan, AuditDesign]:
            mech = plan.mechanism.tail_gap(epsilon, partitions)
            probe = plan.model_copy(update={"design": "paper", "mechanism": mech})
            return probe, build_design(probe, dataset)

        def make(epsilon: float, partitions: int, answers: int) -> tuple[ContextBody, str] | None:
            budget = self.answers_budget(plan, epsilon, answers)
            if budget is None:
                return None
            probe, c0 = probe_design(epsilon, partitions)
            name = f"dpicl-audit {plan.seed} tails"
            body = self.context_body(c0, probe, epsilon, 0, name=name) | {"budget": budget}
            return body, c0.query

        _, sample = probe_design(START_EPSILON, PARTITIONS)
        return TailContexts(make, (sample.positive, sample.negative or sample.labels[1]))

    def setting_claims(
        self,
        plan: AuditPlan,
        design: AuditDesign | RdpDesign,
        epsilon: float,
        contexts: Mapping[tuple[str, int], ContextRecord],
    ) -> SettingClaims:
        layout = f"rdp:{design.attack}" if isinstance(design, RdpDesign) else design.layout
        claims = gaussian_setting_claims(plan, epsilon, contexts, layout)
        if claims.sigma is None:
            return claims
        # Both designs' clean vote vectors differ by (+1, -1): the noisy votes are the
        # Gaussian mechanism at full sensitivity sqrt(2), so this is also the design's.
        exact = voting_epsilon_exact(claims.sigma, plan.mechanism.delta)
        return release_claims(replace(claims, epsilon_exact=exact), design, plan)

    def estimate(self, s: SettingRows) -> SettingResult:
        calls = self.calls_per_query(s.plan)
        if isinstance(s.design, RdpDesign):
            return estimate_sequence(s, calls)
        return estimate_votes(s, calls)

    def claims_per_setting(
        self, design: AuditDesign | RdpDesign, threat_models: Sequence[str]
    ) -> int:
        # Paper 003's sequences state theirs from two composed bounds (the 2-cut and the
        # k-cut, each at the plan's confidence: .rdp_estimates), not per threat model.
        if isinstance(design, RdpDesign):
            return len(RDP_CUTS)
        return len(threat_models)


def _votes(value: JsonValue, name: str) -> JsonObject:
    """The votes an answer holds under ``name``, each a number."""
    if not isinstance(value, Mapping):
        raise TargetProtocolError(f"/v1/debug/classify returned no {name} mapping")
    try:
        return {str(k): json_float(v) for k, v in value.items()}
    except (TypeError, ValueError) as exc:
        raise TargetProtocolError(f"/v1/debug/classify: {name} holds non-numbers") from exc


def white_box_votes(out: JsonMapping, at: TrialAt) -> JsonObject:
    """What a white-box voting trial logs of ``/v1/debug/classify``: the noisy votes, sigma,
    and the clean votes (required when ``at.need_clean``: bootstrap needs them)."""
    require_keys(out, ("noisy_votes", "sigma"), "POST /v1/debug/classify")
    observation: JsonObject = {
        "noisy_votes": _votes(out.get("noisy_votes"), "noisy_votes"),
        "sigma": out.get("sigma"),
    }
    clean = out.get("clean_votes")
    if clean is not None:
        observation["clean_votes"] = _votes(clean, "clean_votes")
    elif at.need_clean:
        raise needs_internal("/v1/debug/classify", "clean_votes")
    return observation


VOTING = VotingAudit()
