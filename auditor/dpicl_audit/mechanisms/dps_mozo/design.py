"""DPS-MOZO's neighbour design as data (paper 004): the canary ``(x_c, s1)`` against the
replacement ``(x_r, s0)`` at one seeded position, the query ``x_c``, and the decision rule
(the released text starts with s1). Stored with the run as JSON; read by :mod:`.audit`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpicl_audit.datasets import Example, LabelledDataset
from dpicl_audit.errors import DatasetError
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.mechanisms.dps_mozo.settings import MozoSettings
from dpicl_audit.mechanisms.neighbours import NeighbourPair, pair_from_json, pair_to_json
from dpicl_audit.plan import AuditPlan
from dpicl_audit.prompts import MOZO_TEMPLATE, mozo_question

__all__ = ["MozoDesign", "decide", "mozo_design"]

_CANARY_RECORD = "7F3Q"
_REPLACEMENT_RECORD = "2K8M"
_LEADING = " \t\r\n\"'“‘`*("


def decide(text: str, signal1: str) -> int:
    """1 when the released text starts with signal 1, ignoring case and leading whitespace
    or quotes (the question quotes the signals, so a model may answer ``"red"``)."""
    return int(text.lstrip(_LEADING).casefold().startswith(signal1.casefold()))


@dataclass(frozen=True, slots=True)
class MozoDesign(NeighbourPair):
    """The DPS-MOZO neighbour pair and audit query (JSON round-trip)."""

    attack: str
    position: int
    query: str
    signals: tuple[str, str]
    template: str
    canary: Example
    replacement: Example
    exemplars_c0: tuple[Example, ...]

    def decide_text(self, text: str) -> int:
        return decide(text, self.signals[0])

    def to_json(self) -> JsonObject:
        return pair_to_json(self) | {"design_kind": "dps-mozo"}

    @classmethod
    def from_json(cls, data: JsonMapping) -> MozoDesign:
        d = pair_from_json(data)
        d["signals"] = tuple(d["signals"])
        return cls(**d)


def mozo_design(plan: AuditPlan, dataset: LabelledDataset) -> MozoDesign:
    """Replace-one neighbours: the canary ``(x_c, s1)`` against ``(x_r, s0)`` at one seeded
    position among ``exemplars - 1`` fillers from the dataset."""
    n = MozoSettings.of(plan).exemplars
    signals = plan.mozo.signals
    rng = np.random.default_rng(plan.seed)
    fillers: list[Example] = []
    if n > 1:
        pool = dataset.examples
        if len(pool) < n - 1:
            raise DatasetError(
                f"dataset {dataset.name!r} has {len(pool)} examples, fewer than {n - 1}"
            )
        pick = rng.choice(len(pool), size=n - 1, replace=False)
        fillers = [pool[int(j)] for j in pick]
    drawn = int(rng.integers(n))
    position = plan.neighbour.position if plan.neighbour.position is not None else drawn
    query = mozo_question(_CANARY_RECORD, signals)
    replacement = Example(mozo_question(_REPLACEMENT_RECORD, signals), signals[1])
    c0 = (*fillers[:position], replacement, *fillers[position:])
    return MozoDesign(
        attack=plan.attack,
        position=position,
        query=query,
        signals=signals,
        template=MOZO_TEMPLATE,
        canary=Example(query, signals[0]),
        replacement=replacement,
        exemplars_c0=c0,
    )
