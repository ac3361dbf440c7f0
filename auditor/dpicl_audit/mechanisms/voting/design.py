"""Voting's neighbour designs as data: the dataclass stored with a run.

``paper`` (paper 000's [1, T-1] against [0, T]), ``pivotal`` and ``identical``
(docs/auditing.md, "Designs"; built in :mod:`.build`): the other ``T - 1`` partitions pinned
so that the canary's partition decides the released label
(:func:`~dpicl_audit.estimators.label_release.pivotal_design`). The trials and estimates
that read a design live in :mod:`.audit` and :mod:`.estimates`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpicl_audit.catalog.attacks import Attack
from dpicl_audit.datasets import Example
from dpicl_audit.estimators.label_release import pivotal_design
from dpicl_audit.jsontypes import JsonMapping, JsonObject, JsonValue, json_float, json_object
from dpicl_audit.mechanisms.neighbours import NeighbourPair, pair_from_json, pair_to_json
from dpicl_audit.plan import CanaryKind

__all__ = ["AuditDesign", "design_votes"]


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

    def score(self, noisy_votes: JsonValue) -> float:
        """White-box statistic: noisy[pos] - noisy[neg] (Section 3.2 of paper 000).

        For Brainwash (no single negative answer) the margin over the best other label.
        """
        votes = json_object(noisy_votes)  # as a trial logged them
        try:
            pos = json_float(votes[self.positive])
            if self.negative is not None:
                return pos - json_float(votes[self.negative])
            others = [json_float(v) for k, v in votes.items() if k != self.positive]
        except KeyError as exc:
            raise KeyError(f"noisy votes lack the label {exc.args[0]!r}") from exc
        return pos - max(others) if others else pos

    def clean_vector(self, votes: JsonValue) -> list[float]:
        """A vote histogram in the order of :attr:`labels`."""
        logged = json_object(votes)  # a trial's clean votes as logged
        return [json_float(logged.get(lab, 0.0)) for lab in self.labels]

    def summary_fields(self) -> JsonObject:
        """What a run's summary shows of this design beyond the neighbours."""
        return {
            "labels": list(self.labels),
            "positive": self.positive,
            "negative": self.negative,
            "query": self.query,
            "design": self.layout,
        }

    def to_json(self) -> JsonObject:
        return pair_to_json(self)

    @classmethod
    def from_json(cls, data: JsonMapping) -> AuditDesign:
        d = pair_from_json(data)
        d["labels"] = tuple(d["labels"])
        return cls(**d)


def design_votes(design: AuditDesign, partitions: int) -> tuple[list[int], list[int]]:
    """The clean vote histograms (positive, negative) the design intends in C1 and C0."""
    if design.layout == "paper":
        return [1, partitions - 1], [0, partitions]

    d = pivotal_design(partitions)
    return list(d.votes_with), list(d.votes_without)
