"""Building voting's neighbour designs from the plan and the dataset (seeded by the plan).

``paper``: paper 000's canary in one partition of ``shots`` exemplars (:func:`build_design`);
``pivotal`` and ``identical``: the other partitions pinned (:func:`build_pinned_design`).
Paper 003's query sequences are built in :mod:`.rdp`.
"""

from __future__ import annotations

import numpy as np

from dpicl_audit.catalog.settings import PartitionedSettings
from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError, InvalidPlan
from dpicl_audit.estimators.label_release import pivotal_design
from dpicl_audit.mechanisms.neighbours import (
    MIN_ORACLE_CHARS,
    STREAM_DESIGN,
    neighbour_slot,
    other_label,
    pick_exemplars,
    random_canary_text,
    resolve_design,
)
from dpicl_audit.mechanisms.voting.design import AuditDesign
from dpicl_audit.plan import AuditPlan, VotingDesign
from dpicl_audit.prompts import (
    AUDIT_NEGATIVE,
    AUDIT_POSITIVE,
    AUDIT_TEMPLATE,
    CLASSIFY_TEMPLATE,
    MINIMAL_TEMPLATE,
    audit_query,
    brainwash_query,
    deployment_query,
)

__all__ = ["build_design", "build_pinned_design"]


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

    rng = np.random.default_rng([plan.seed, STREAM_DESIGN, 1 if layout == "pivotal" else 2])
    t = PartitionedSettings.of(plan).partitions
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
