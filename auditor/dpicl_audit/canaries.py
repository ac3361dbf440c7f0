"""Canary and neighbour contexts: the replace-one pair (C1, C0) an audit distinguishes.

Both contexts hold ``partitions x shots`` exemplars in the same order with the same
``partition_seed``; they differ at exactly one position, where C1 holds the canary and C0 a
replacement exemplar drawn from the same dataset. The server assigns exemplars to
partitions by position after a seeded permutation, so the pair differs in exactly one
partition (DESIGN.md section 4).

Everything is drawn from the plan's ``seed``; the whole design (exemplars of both contexts,
the query, the answers that mean "present") is stored with the run so a resumed run needs
neither the dataset nor the seed logic of the version that started it.

Canary kinds:

* ``natural``: an example of the dataset with its own label;
* ``mislabeled``: an example of the dataset with a different label, drawn at random;
* ``random``: a random string of made-up words with a random label.

Exemplar outputs must be labels of the context (the server checks this). In the
``audit-template`` setting the context's labels are Prompt 1's ``Yes``/``No``, so each
exemplar's output is a fair coin over ``Yes``/``No`` drawn from the seed (the verification
prompt asks about the text, not the topic); the canary takes the replacement's output when
``natural``, the other one when ``mislabeled``, a coin when ``random``. The Brainwash
attack and the ``deployment`` setting keep the dataset's own labels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError, InvalidPlan
from dpicl_audit.plan import Attack, AuditPlan, CanaryKind
from dpicl_audit.prompts import (
    AUDIT_NEGATIVE,
    AUDIT_POSITIVE,
    AUDIT_TEMPLATE,
    CLASSIFY_TEMPLATE,
    audit_query,
    brainwash_query,
    deployment_query,
)

__all__ = ["AuditDesign", "build_design", "context_body", "random_canary_text"]

# Independent random streams derived from the plan's seed.
STREAM_DESIGN = 0xC4_4A21
MIN_ORACLE_CHARS = 8

_SYLLABLES = (
    "ka", "zu", "mor", "vel", "tri", "qua", "son", "lix", "bre", "dov", "fen", "gro",
    "hul", "jin", "pla", "rud", "sek", "tam", "wub", "yor", "zen", "oth", "ump", "ist",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class AuditDesign:
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

    @property
    def exemplars_c1(self) -> tuple[Example, ...]:
        ex = list(self.exemplars_c0)
        ex[self.position] = self.canary
        return tuple(ex)

    def exemplars(self, world: int) -> tuple[Example, ...]:
        """C1's exemplars for ``world == 1``, C0's for ``world == 0``."""
        return self.exemplars_c1 if world == 1 else self.exemplars_c0

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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["labels"] = list(self.labels)
        data["exemplars_c0"] = [asdict(e) for e in self.exemplars_c0]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditDesign:
        d = dict(data)
        d["labels"] = tuple(d["labels"])
        d["canary"] = Example(**d["canary"])
        d["replacement"] = Example(**d["replacement"])
        d["exemplars_c0"] = tuple(Example(**e) for e in d["exemplars_c0"])
        return cls(**d)


def random_canary_text(rng: np.random.Generator, words: int = 7) -> str:
    """Made-up words from fixed syllables: no quotes, never in any real corpus."""
    out = []
    for _ in range(words):
        n = int(rng.integers(2, 4))
        out.append("".join(_SYLLABLES[int(i)] for i in rng.integers(0, len(_SYLLABLES), size=n)))
    text = " ".join(out)
    return text[0].upper() + text[1:] + "."


def _other_label(rng: np.random.Generator, labels: Sequence[str], label: str) -> str:
    others = [lab for lab in labels if lab != label]
    if not others:
        raise DatasetError(f"no label other than {label!r} to mislabel the canary with")
    return others[int(rng.integers(len(others)))]


def pick_exemplars(
    pool: Sequence[Example],
    *,
    canary_text: str,
    query: str,
    k: int,
    dataset: LabelledDataset,
    exclude: Sequence[str] = (),
) -> list[Example]:
    """The first ``k`` examples of ``pool`` usable beside the canary: never one containing
    the canary's text (or any of ``exclude``), never one whose text the query contains (the
    oracle, and a literal-minded model, would take it for the canary)."""
    needle = canary_text.strip()
    usable = [
        ex
        for ex in pool
        if needle not in ex.input
        and ex.input.strip() not in query
        and not any(x in ex.input for x in exclude)
    ]
    if len(usable) < k:
        raise DatasetError(
            f"dataset {dataset.name!r} has {len(usable)} usable examples besides the canary; "
            f"the contexts need {k} (partitions x shots)"
        )
    return usable[:k]


def neighbour_slot(plan: AuditPlan, rng: np.random.Generator, k: int) -> tuple[int, int]:
    """The replaced position and the shared partition seed: the plan's, or drawn."""
    position = (
        plan.neighbour.position if plan.neighbour.position is not None else int(rng.integers(k))
    )
    partition_seed = (
        plan.neighbour.partition_seed
        if plan.neighbour.partition_seed is not None
        else int(rng.integers(0, 2**63 - 1))
    )
    return position, partition_seed


def build_design(plan: AuditPlan, dataset: LabelledDataset) -> AuditDesign:
    """Draw the canary, the replacement, the other exemplars, the position and the seed."""
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
            canary_label = _other_label(rng, labels, canary_label)
    if len(canary_text.strip()) < MIN_ORACLE_CHARS:
        raise DatasetError(
            f"canary text {canary_text!r} is shorter than {MIN_ORACLE_CHARS} characters; "
            "a membership query cannot name it unambiguously"
        )

    # --- the query and the answers
    wrong: str | None = None
    negative: str | None
    if plan.attack == "brainwash":
        wrong = _other_label(rng, labels, canary_label)
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
            canary_label = _other_label(rng, labels, replacement.output)
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
    mech = plan.mechanism
    body: dict[str, Any] = {
        "name": name,
        "task": "classification",
        "labels": list(design.labels),
        "exemplars": [{"input": e.input, "output": e.output} for e in design.exemplars(world)],
        "mechanism": {
            "name": "voting",
            "epsilon": float(epsilon),
            "delta": mech.delta,
            "partitions": mech.partitions,
            "partition_seed": design.partition_seed,
            "partitioning": "positional",
            "calibration": mech.calibration,
            "temperature": mech.temperature,
        },
        # An audit asks as many queries as it needs: the server must allow unbudgeted
        # contexts (DPICL_ALLOW_UNBUDGETED), an explicit operator choice.
        "budget": None,
    }
    if design.template is not None:
        body["template"] = design.template
    return body
