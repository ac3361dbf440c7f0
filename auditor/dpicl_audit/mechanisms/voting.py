"""Auditing private voting (paper 000, Algorithm 2; audits of Section 3.2 and Appendix B).

* **Neighbours.** C1 and C0 hold ``partitions x shots`` exemplars in the same order with the
  same ``partition_seed`` and differ at one position (:mod:`.neighbours`). Canary kinds:
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
  with the server's sigma (:func:`dpicl_audit.bootstrap.bootstrap_voting_audit`), after the
  noise check (:mod:`dpicl_audit.noise_check`).

The design is stored with the run, so a resumed run needs neither the dataset nor the seed
logic of the version that started it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpicl_audit.client import AuditTarget
from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError, InvalidPlan
from dpicl_audit.mechanisms.base import (
    GaussianMechanismAudit,
    TrialAt,
    gaussian_setting_meta,
)
from dpicl_audit.mechanisms.neighbours import (
    MIN_ORACLE_CHARS,
    STREAM_DESIGN,
    neighbour_slot,
    other_label,
    pick_exemplars,
    random_canary_text,
)
from dpicl_audit.mechanisms.voting_designs import (
    AuditDesign,
    build_pinned_design,
    design_votes,
    resolve_design,
)
from dpicl_audit.mechanisms.voting_rdp import RDP_ATTACKS, RdpDesign, build_rdp_design
from dpicl_audit.plan import AuditPlan
from dpicl_audit.prompts import (
    AUDIT_NEGATIVE,
    AUDIT_POSITIVE,
    AUDIT_TEMPLATE,
    CLASSIFY_TEMPLATE,
    audit_query,
    brainwash_query,
    deployment_query,
)
from dpicl_audit.store import ContextRecord, TrialRecord
from dpicl_audit.verdicts import RDP_CUTS

__all__ = [
    "AuditDesign",
    "VotingAudit",
    "build_design",
    "build_pinned_design",
    "context_body",
    "design_votes",
    "resolve_design",
]


def build_design(plan: AuditPlan, dataset: LabelledDataset) -> AuditDesign:
    """Draw the canary, the replacement, the other exemplars, the position and the seed.

    ``plan.design`` must be resolved (:func:`resolve_design`); ``auto`` builds the pivotal
    design (what a simulator gets)."""
    layout = resolve_design(plan, simulator=True)
    if layout != "paper":
        return build_pinned_design(plan, dataset, layout)
    rng = np.random.default_rng([plan.seed, STREAM_DESIGN])
    k = plan.mechanism.n_exemplars
    data_labels = dataset.labels

    # Which labels the contexts use, and whether exemplars keep their dataset labels.
    template: str | None
    if plan.setting == "deployment":
        labels = tuple(plan.deployment.labels or data_labels)
        missing = sorted(set(data_labels) - set(labels))
        if missing:
            raise DatasetError(
                f"dataset {dataset.name!r} has labels {missing} that are not in the "
                f"deployment's label set {list(labels)}"
            )
        template = plan.deployment.template
        yes_no = False
    elif plan.attack == "brainwash":
        labels, template, yes_no = tuple(data_labels), CLASSIFY_TEMPLATE, False
    else:
        labels, template, yes_no = (AUDIT_POSITIVE, AUDIT_NEGATIVE), AUDIT_TEMPLATE, True
    if len(labels) < 2:
        raise DatasetError(f"the audit needs at least 2 labels, dataset has {list(labels)}")

    order = rng.permutation(len(dataset))
    # --- the canary (text and label as placed in C1)
    if plan.canary == "random":
        canary_text = random_canary_text(rng)
        canary_label = labels[int(rng.integers(len(labels)))]
        pool = [dataset.examples[int(i)] for i in order]
    else:
        first = dataset.examples[int(order[0])]
        canary_text, canary_label = first.input, first.output
        pool = [dataset.examples[int(i)] for i in order[1:]]
        if plan.canary == "mislabeled" and not yes_no:
            canary_label = other_label(rng, labels, canary_label)
    if len(canary_text.strip()) < MIN_ORACLE_CHARS:
        raise DatasetError(
            f"canary text {canary_text!r} is shorter than {MIN_ORACLE_CHARS} characters; "
            "a membership query cannot name it unambiguously"
        )

    # --- the query and the answers
    wrong: str | None = None
    negative: str | None
    if plan.attack == "brainwash":
        wrong = other_label(rng, labels, canary_label)
        lead = "Query Text: " if plan.setting == "audit-template" else "Input: "
        query = brainwash_query(canary_text, wrong, lead=lead)
        positive, negative = canary_label, None
    elif plan.setting == "deployment":
        positive = plan.deployment.positive or labels[0]
        negative = plan.deployment.negative or next(lab for lab in labels if lab != positive)
        for name, lab in (("positive", positive), ("negative", negative)):
            if lab not in labels:
                raise InvalidPlan(f"deployment.{name} {lab!r} is not one of {list(labels)}")
        query = deployment_query(canary_text, positive, negative)
    else:
        positive, negative = AUDIT_POSITIVE, AUDIT_NEGATIVE
        query = audit_query(canary_text)

    # --- the other exemplars: never the canary's text, never text the query contains
    chosen = pick_exemplars(pool, canary_text=canary_text, query=query, k=k, dataset=dataset)
    if yes_no:
        coins = rng.integers(0, 2, size=k)
        chosen = [Example(ex.input, labels[int(c)]) for ex, c in zip(chosen, coins, strict=True)]
    position, partition_seed = neighbour_slot(plan, rng, k)
    replacement = chosen[position]
    if yes_no:
        if plan.canary == "natural":
            canary_label = replacement.output
        elif plan.canary == "mislabeled":
            canary_label = other_label(rng, labels, replacement.output)
    return AuditDesign(
        attack=plan.attack,
        canary_kind=plan.canary,
        labels=labels,
        template=template,
        position=position,
        partition_seed=partition_seed,
        canary=Example(canary_text, canary_label),
        replacement=replacement,
        exemplars_c0=tuple(chosen),
        query=query,
        positive=positive,
        negative=negative,
        wrong_label=wrong,
    )


def context_body(
    design: AuditDesign, plan: AuditPlan, epsilon: float, world: int, *, name: str
) -> dict[str, Any]:
    """The ``POST /v1/contexts`` body of C1 (``world == 1``) or C0 at one epsilon."""
    return VOTING.context_body(design, plan, epsilon, world, name=name)


class VotingAudit(GaussianMechanismAudit):
    """Private voting: labels released by a noisy argmax over T partition votes."""

    name = "voting"
    task = "classification"
    design_type = AuditDesign
    clean_name = "clean votes"

    def build_design(self, plan: AuditPlan, dataset: LabelledDataset) -> AuditDesign | RdpDesign:
        if plan.attack in RDP_ATTACKS:  # paper 003's adversaries: query sequences
            return build_rdp_design(plan, dataset)
        return build_design(plan, dataset)

    def load_design(self, data: Mapping[str, Any]) -> AuditDesign | RdpDesign:
        if data.get("design_kind") == "rdp":
            return RdpDesign.from_json(data)
        return AuditDesign.from_json(data)

    def summary(self, design: AuditDesign | RdpDesign) -> dict[str, Any]:
        return self.neighbour_summary(design) | design.summary_fields()

    def context_body(
        self,
        design: AuditDesign | RdpDesign,
        plan: AuditPlan,
        epsilon: float,
        world: int,
        *,
        name: str,
    ) -> dict[str, Any]:
        body = self.base_body(design, plan, epsilon, world, name=name)
        body["labels"] = list(design.labels)
        if design.template is not None:
            body["template"] = design.template
        return body

    async def trial(
        self, target: AuditTarget, design: AuditDesign | RdpDesign, plan: AuditPlan, at: TrialAt
    ) -> TrialRecord:
        return await design.trial(target, at)

    def setting_meta(
        self,
        plan: AuditPlan,
        design: AuditDesign | RdpDesign,
        epsilon: float,
        contexts: Mapping[tuple[str, int], ContextRecord],
    ) -> dict[str, Any]:
        meta, mech = gaussian_setting_meta(plan, epsilon, contexts)
        sigma: float | None = None
        if mech is not None:
            from dpicl_audit.estimators import voting_epsilon_exact  # dp-accounting: slow

            # Both designs' clean vote vectors differ by (+1, -1): the noisy votes are the
            # Gaussian mechanism at full sensitivity sqrt(2), so this is also the design's.
            sigma = meta["sigma"]
            meta["epsilon_exact"] = voting_epsilon_exact(meta["sigma"], plan.mechanism.delta)
        meta.update(design.release_meta(plan, sigma))
        return meta

    def estimate(
        self,
        plan: AuditPlan,
        design: AuditDesign | RdpDesign,
        k: int,
        rows: Sequence[TrialRecord],
        meta: dict[str, Any],
        *,
        bootstrap: bool,
    ) -> dict[str, Any]:
        calls = self.calls_per_query(plan)
        return design.estimate(plan, k, rows, meta, bootstrap=bootstrap, calls_per_query=calls)

    def claims_per_setting(
        self, design: AuditDesign | RdpDesign, threat_models: Sequence[str]
    ) -> int:
        # Paper 003's sequences state theirs from two composed bounds (the 2-cut and the
        # k-cut, each at the plan's confidence: voting_rdp_estimates), not per threat model.
        if isinstance(design, RdpDesign):
            return len(RDP_CUTS)
        return len(threat_models)


VOTING = VotingAudit()
