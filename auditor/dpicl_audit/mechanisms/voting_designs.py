"""Voting's neighbour design: the dataclass stored with a run, and the pinned designs.

``paper`` (paper 000's [1, T-1] against [0, T], built in :mod:`.voting`), ``pivotal`` and
``identical`` (docs/auditing.md, "Designs"): the other ``T - 1`` partitions pinned so that the
canary's partition decides the released label
(:func:`~dpicl_audit.estimators.label_release.pivotal_design`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpicl_audit.client import AuditTarget
from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError, InvalidPlan, TargetProtocolError
from dpicl_audit.mechanisms.base import (
    TrialAt,
    ask,
    estimate_trials,
    needs_internal,
    with_verdict,
)
from dpicl_audit.mechanisms.neighbours import (
    MIN_ORACLE_CHARS,
    STREAM_DESIGN,
    NeighbourPair,
    neighbour_slot,
    pair_from_json,
    pair_to_json,
    pick_exemplars,
    random_canary_text,
)
from dpicl_audit.plan import Attack, AuditPlan, CanaryKind, VotingDesign
from dpicl_audit.prompts import (
    AUDIT_NEGATIVE,
    AUDIT_POSITIVE,
    AUDIT_TEMPLATE,
    MINIMAL_TEMPLATE,
    audit_query,
)
from dpicl_audit.store import TrialRecord

__all__ = [
    "AuditDesign",
    "build_pinned_design",
    "design_votes",
    "release_reference",
    "resolve_design",
    "white_box_votes",
]


@dataclass(frozen=True, slots=True)
class AuditDesign(NeighbourPair):
    """The neighbour pair and the audit query; JSON round-trips via to_json / from_json."""

    attack: Attack
    canary_kind: CanaryKind
    labels: tuple[str, ...]
    template: str | None  # None: the server's default template (deployment setting)
    position: int
    partition_seed: int
    canary: Example  # as placed in C1 at ``position``
    replacement: Example  # as placed in C0 at ``position``
    exemplars_c0: tuple[Example, ...]
    query: str
    positive: str  # the answer that means "canary present"
    negative: str | None  # the other answer (inquery); None: every other label (brainwash)
    wrong_label: str | None = None  # brainwash: the label injected with the canary
    layout: str = "paper"  # "paper", "pivotal" or "identical" (docs/auditing.md, "Designs")

    def decide_label(self, label: str) -> int:
        """Black-box rule: 1 ("present") when the released label is the positive answer."""
        return int(label == self.positive)

    def score(self, noisy_votes: Mapping[str, float]) -> float:
        """White-box statistic: noisy[pos] - noisy[neg] (Section 3.2 of paper 000).

        For Brainwash (no single negative answer) the margin over the best other label.
        """
        try:
            pos = float(noisy_votes[self.positive])
            if self.negative is not None:
                return pos - float(noisy_votes[self.negative])
            others = [float(v) for k, v in noisy_votes.items() if k != self.positive]
        except KeyError as exc:
            raise KeyError(f"noisy votes lack the label {exc.args[0]!r}") from exc
        return pos - max(others) if others else pos

    def clean_vector(self, votes: Mapping[str, float]) -> list[float]:
        """A vote histogram in the order of :attr:`labels`."""
        return [float(votes.get(lab, 0.0)) for lab in self.labels]

    async def trial(self, target: AuditTarget, at: TrialAt) -> TrialRecord:
        """Trial ``at.index``: ask :attr:`query`; the label, and (white-box) the votes and
        :meth:`score`."""
        out, latency = await ask(target, at, self.query)
        label = str(out["label"])
        observation: dict[str, Any] = {"label": label}
        score: float | None = None
        if at.white:
            observation |= white_box_votes(out, at)
            try:
                score = self.score(observation["noisy_votes"])
            except KeyError as exc:
                raise TargetProtocolError(f"/v1/debug/classify: {exc.args[0]}") from exc
        return at.record(self.query, observation, self.decide_label(label), latency, score)

    def estimate(
        self,
        plan: AuditPlan,
        k: int,
        rows: Sequence[TrialRecord],
        meta: dict[str, Any],
        *,
        bootstrap: bool,
        calls_per_query: int,
    ) -> dict[str, Any]:
        """One setting's estimates: Algorithm 1 of paper 000 (``bootstrap``) or the trials'."""
        from dpicl_audit.mechanisms.conformance_checks import voting_conformance

        if bootstrap:
            from dpicl_audit.mechanisms.voting_bootstrap import estimate_voting_bootstrap

            out = estimate_voting_bootstrap(plan, self, k, rows, meta)
        else:
            out = estimate_trials(plan, k, rows, meta, calls_per_query=calls_per_query)
            bb = out.get("black_box")
            ref = release_reference(
                meta, self.attack, plan.setting if plan.mechanism.temperature == 0 else ""
            )
            if ref is not None and isinstance(bb, dict) and "verdict" in bb:
                out["black_box"] = with_verdict(bb, ref)
        if bootstrap:  # the setting's own debug rows (the clean log holds every setting's)
            ids = {cid for cid in meta["context_ids"].values() if cid is not None}
            rows = [r for r in rows if r.context_id in ids]
        return voting_conformance(
            self,
            out,
            rows,
            meta,
            temperature=plan.mechanism.temperature,
            bootstrap=bootstrap,
            known_votes=plan.setting == "audit-template",
        )

    def summary_fields(self) -> dict[str, Any]:
        """What a run's summary shows of this design beyond the neighbours."""
        return {
            "labels": list(self.labels),
            "positive": self.positive,
            "negative": self.negative,
            "query": self.query,
            "design": self.layout,
        }

    def release_meta(self, plan: AuditPlan, sigma: float | None) -> dict[str, Any]:
        """A setting's meta from this design: the layout, and where the noise ``sigma`` is
        known the released label's own exact epsilon at the design's intended clean votes
        (the ceiling of the assumption-free black-box bound) and its release rates."""
        meta: dict[str, Any] = {}
        if sigma is not None:
            from dpicl_audit.estimators.label_release import (
                label_release_epsilon,
                label_release_probabilities,
            )

            with_v, without_v = design_votes(self, plan.mechanism.partitions)
            meta["epsilon_exact_release"] = label_release_epsilon(
                with_v, without_v, sigma, plan.mechanism.delta
            )
            meta["release_rates"] = [
                float(label_release_probabilities(v, sigma)[0]) for v in (with_v, without_v)
            ]
        meta["design"] = self.layout
        return meta

    def to_json(self) -> dict[str, Any]:
        return pair_to_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditDesign:
        d = pair_from_json(data)
        d["labels"] = tuple(d["labels"])
        return cls(**d)


def release_reference(meta: Mapping[str, Any], attack: str, setting: str) -> dict[str, Any] | None:
    """The meta the black-box figure reads on the simulator, whose clean votes are exactly
    the design's: the released label's own exact epsilon ``epsilon_exact_release`` is the
    reference where it is below the worst case (issue 27: a bound above the design's own
    exact epsilon is a BUG, e.g. a tail gap that a bounded noise never crosses). None
    elsewhere (a real model's votes may differ from the design's)."""
    rel, exact = meta.get("epsilon_exact_release"), meta.get("epsilon_exact")
    # Only the membership prompt's votes are the design's on the simulator (a deployment's
    # classification prompt is answered by the most similar demonstration's label), and
    # only at temperature 0 (the caller passes no setting otherwise).
    known = meta.get("simulator") and attack == "inquery" and setting == "audit-template"
    if not known or rel is None or exact is None:
        return None
    if float(rel) >= float(exact):
        return None
    # The classical figure only: the release's trade-off is not a Gaussian's, so the GDP
    # figure stays read against the mechanism's own mu; power stays judged against the
    # worst case (a weak design must not read as having power).
    return dict(meta) | {"epsilon_exact_design": float(rel), "epsilon_exact_design_gaussian": False}


def resolve_design(plan: AuditPlan, *, simulator: bool | None) -> VotingDesign:
    """The design ``auto`` stands for: pivotal on a simulator, identical-text on a real
    engine (``simulator`` False or unknown), paper's for attacks and settings the pinned
    designs do not cover (voting and ESA alike; ESA's in :mod:`.esa_designs`)."""
    if plan.design != "auto":
        return plan.design
    if plan.mechanism.name not in ("voting", "esa") or plan.attack != "inquery":
        return "paper"
    if plan.setting != "audit-template":
        return "paper"
    return "pivotal" if simulator else "identical"


def build_pinned_design(
    plan: AuditPlan, dataset: LabelledDataset, layout: VotingDesign
) -> AuditDesign:
    """A pivotal canary: one exemplar per partition, the other ``T - 1`` partitions pinned
    (the same in both worlds) so that the canary's partition decides the released label
    (:func:`~dpicl_audit.estimators.label_release.pivotal_design`: C1 = [m+1, m] against
    C0 = [m, m+1] for odd T; for even T the clean tie [m, m] is C0's).

    * ``pivotal`` (Prompt 1, "is this text present?"): a partition votes "Yes" when it holds
      the queried text x; the pinned "Yes" partitions hold a copy of x, the pinned "No" ones
      other texts; the canary partition holds x in C1 and a replacement text in C0.
    * ``identical``: every partition holds the same text x (made-up words), labels are two
      made-up words A/B, the template is minimal and the query is x; the canary partition
      holds (x, A) in C1 and (x, B) in C0, the pinned ones (x, A) or (x, B). A model that
      copies the label of an identical demonstration votes its partition's label.

    Replace-one adjacency holds at the canary's position: C1 and C0 differ there only.
    """
    from dpicl_audit.estimators.label_release import pivotal_design

    rng = np.random.default_rng([plan.seed, STREAM_DESIGN, 1 if layout == "pivotal" else 2])
    t = plan.mechanism.partitions
    if t < 2:
        raise InvalidPlan(f"the {layout} design needs at least 2 partitions, got {t}")
    pinned = pivotal_design(t).other_labels  # label index per other partition: 0 = A, 1 = B
    position, partition_seed = neighbour_slot(plan, rng, t)
    if position >= t:
        raise InvalidPlan(
            f"neighbour.position {position} is outside the {layout} design's {t} exemplars "
            "(one per partition)"
        )
    order = rng.permutation(len(dataset))
    if layout == "identical" or plan.canary == "random":
        x = random_canary_text(rng)
    else:
        x = dataset.examples[int(order[0])].input
    if len(x.strip()) < MIN_ORACLE_CHARS:
        raise DatasetError(f"canary text {x!r} is shorter than {MIN_ORACLE_CHARS} characters")
    others: list[Example]
    if layout == "identical":
        a = random_canary_text(rng, words=1).rstrip(".")
        b = a
        while b == a:
            b = random_canary_text(rng, words=1).rstrip(".")
        labels, template, query = (a, b), MINIMAL_TEMPLATE, x
        canary, replacement = Example(x, a), Example(x, b)
        others = [Example(x, labels[j]) for j in pinned]
    else:
        labels, template, query = (AUDIT_POSITIVE, AUDIT_NEGATIVE), AUDIT_TEMPLATE, audit_query(x)
        pool = [dataset.examples[int(i)] for i in order[1:]]
        n_no = sum(1 for j in pinned if j == 1)
        texts = pick_exemplars(pool, canary_text=x, query=query, k=n_no + 1, dataset=dataset)
        coins = rng.integers(0, 2, size=t)
        replacement = Example(texts[0].input, labels[int(coins[0])])
        canary = Example(x, replacement.output)  # natural: the replacement's output
        if plan.canary == "mislabeled":
            canary = Example(x, labels[1 - int(coins[0])])
        no_texts = iter(texts[1:])
        others = [
            Example(x if j == 0 else next(no_texts).input, labels[int(c)])
            for j, c in zip(pinned, coins[1:], strict=True)
        ]
        a = AUDIT_POSITIVE
    exemplars = [*others[:position], replacement, *others[position:]]
    return AuditDesign(
        attack=plan.attack,
        canary_kind=plan.canary,
        labels=tuple(labels),
        template=template,
        position=position,
        partition_seed=partition_seed,
        canary=canary,
        replacement=replacement,
        exemplars_c0=tuple(exemplars),
        query=query,
        positive=a,
        negative=labels[1],
        layout=layout,
    )


def _votes(value: Any, name: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise TargetProtocolError(f"/v1/debug/classify returned no {name} mapping")
    try:
        return {str(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError) as exc:
        raise TargetProtocolError(f"/v1/debug/classify: {name} holds non-numbers") from exc


def white_box_votes(out: Mapping[str, Any], at: TrialAt) -> dict[str, Any]:
    """What a white-box voting trial logs of ``/v1/debug/classify``: the noisy votes, sigma,
    and the clean votes (required when ``at.need_clean``: bootstrap needs them)."""
    observation: dict[str, Any] = {
        "noisy_votes": _votes(out.get("noisy_votes"), "noisy_votes"),
        "sigma": out.get("sigma"),
    }
    clean = out.get("clean_votes")
    if clean is not None:
        observation["clean_votes"] = _votes(clean, "clean_votes")
    elif at.need_clean:
        raise needs_internal("/v1/debug/classify", "clean_votes")
    return observation


def design_votes(design: AuditDesign, partitions: int) -> tuple[list[int], list[int]]:
    """The clean vote histograms (positive, negative) the design intends in C1 and C0."""
    if design.layout == "paper":
        return [1, partitions - 1], [0, partitions]
    from dpicl_audit.estimators.label_release import pivotal_design

    d = pivotal_design(partitions)
    return list(d.votes_with), list(d.votes_without)
