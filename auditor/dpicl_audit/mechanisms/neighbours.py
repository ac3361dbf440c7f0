"""Replace-one neighbours shared by every mechanism: canary texts, exemplar picking, the slot.

C1 holds the canary at one position, C0 a replacement there; size, order and
``partition_seed`` are the same, so the two contexts differ in exactly one partition
(DESIGN.md section 4). Everything is drawn from the plan's ``seed`` on the stream
:data:`STREAM_DESIGN`; each mechanism module builds its own design on top of these helpers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.plan import AuditPlan, VotingDesign

__all__ = [
    "MIN_ORACLE_CHARS",
    "STREAM_DESIGN",
    "NeighbourPair",
    "neighbour_slot",
    "other_label",
    "pair_from_json",
    "pair_to_json",
    "pick_exemplars",
    "random_canary_text",
    "replace_at",
    "resolve_design",
]

# Independent random stream derived from the plan's seed.
STREAM_DESIGN = 0xC4_4A21
MIN_ORACLE_CHARS = 8

_SYLLABLES = (
    "ka", "zu", "mor", "vel", "tri", "qua", "son", "lix", "bre", "dov", "fen", "gro",
    "hul", "jin", "pla", "rud", "sek", "tam", "wub", "yor", "zen", "oth", "ump", "ist",
)  # fmt: skip


def random_canary_text(rng: np.random.Generator, words: int = 7) -> str:
    """Made-up words from fixed syllables: no quotes, never in any real corpus."""
    out = []
    for _ in range(words):
        n = int(rng.integers(2, 4))
        out.append("".join(_SYLLABLES[int(i)] for i in rng.integers(0, len(_SYLLABLES), size=n)))
    text = " ".join(out)
    return text[0].upper() + text[1:] + "."


def other_label(rng: np.random.Generator, labels: Sequence[str], label: str) -> str:
    """A label other than ``label``, drawn uniformly."""
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


def replace_at(exemplars: Sequence[Example], position: int, canary: Example) -> tuple[Example, ...]:
    """C1's exemplars: C0's with the canary at ``position``."""
    ex = list(exemplars)
    ex[position] = canary
    return tuple(ex)


class NeighbourPair:
    """What every design is: C0's exemplars, and C1's made by putting the canary at
    ``position`` (a mixin of the mechanisms' frozen design dataclasses)."""

    __slots__ = ()
    position: int
    canary: Example
    replacement: Example
    exemplars_c0: tuple[Example, ...]

    @property
    def exemplars_c1(self) -> tuple[Example, ...]:
        return replace_at(self.exemplars_c0, self.position, self.canary)

    def exemplars(self, world: int) -> tuple[Example, ...]:
        """C1's exemplars for ``world == 1``, C0's for ``world == 0``."""
        return self.exemplars_c1 if world == 1 else self.exemplars_c0


def pair_to_json(design: Any) -> JsonObject:
    """A design dataclass as JSON-ready data (tuples as lists)."""
    data: JsonObject = asdict(design)
    data["exemplars_c0"] = [asdict(e) for e in design.exemplars_c0]
    for key, value in data.items():
        if isinstance(value, tuple):
            data[key] = list(value)
    return data


def pair_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of a stored design: examples rebuilt, ``design_kind``
    dropped (lists stay lists; each design turns its own tuples back)."""
    d = dict(data)
    d.pop("design_kind", None)
    d["canary"] = Example(**d["canary"])
    d["replacement"] = Example(**d["replacement"])
    d["exemplars_c0"] = tuple(Example(**e) for e in d["exemplars_c0"])
    return d


def resolve_design(plan: AuditPlan, *, simulator: bool | None) -> VotingDesign:
    """The design ``auto`` stands for: pivotal on a simulator, identical-text on a real
    engine (``simulator`` False or unknown), paper's for attacks and settings the pinned
    designs do not cover (for every mechanism whose settings declare them,
    ``inquery_designs``: voting, ESA, or one registered from outside; ESA's in
    :mod:`.esa.build`)."""
    if plan.design != "auto":
        return plan.design
    if not plan.mechanism.inquery_designs or plan.attack != "inquery":
        return "paper"
    if plan.setting != "audit-template":
        return "paper"
    return "pivotal" if simulator else "identical"
