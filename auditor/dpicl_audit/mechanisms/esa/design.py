"""ESA's neighbour design as data: the pair, the audit query and the signal texts y1, y0.

Stored with the run (``to_json``/``from_json``), with the signal embeddings e(y1), e(y0)
once :mod:`.signals` has learnt them. Built in :mod:`.build`; read by :mod:`.audit`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from dpicl_audit.datasets import Example
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.mechanisms.neighbours import NeighbourPair, pair_from_json, pair_to_json
from dpicl_audit.plan import AuditPlan
from dpicl_audit.prompts import SIGNAL_PAIRS

__all__ = ["SIGNAL_PAIRS", "FloatArray", "GenerationDesign", "esa_score", "signal_pair"]

FloatArray = npt.NDArray[np.float64]


def signal_pair(plan: AuditPlan) -> tuple[str, str, str]:
    """(name, y1, y0) of the plan: its own pair, or a built-in one by name."""
    g = plan.generation
    if g.y1 is not None and g.y0 is not None:
        return "custom", g.y1.strip(), g.y0.strip()
    y1, y0 = SIGNAL_PAIRS[g.signal]
    return g.signal, y1, y0


def _norm_text(text: str) -> str:
    return " ".join(text.split()).casefold()


def esa_score(noisy_mean: npt.ArrayLike, e1: npt.ArrayLike, e0: npt.ArrayLike) -> float:
    """The white-box statistic ``||m - e(y1)|| - ||m - e(y0)||`` (lower: "present")."""
    m = np.asarray(noisy_mean, dtype=np.float64)
    a, b = np.asarray(e1, dtype=np.float64), np.asarray(e0, dtype=np.float64)
    if m.shape != a.shape or m.shape != b.shape:
        raise InvalidAuditInput(
            f"noisy mean {m.shape} and signal embeddings {a.shape}, {b.shape} differ in shape"
        )
    return float(np.linalg.norm(m - a) - np.linalg.norm(m - b))


@dataclass(frozen=True, slots=True)
class GenerationDesign(NeighbourPair):
    """The ESA neighbour pair, the audit query and the signal texts (JSON round-trip)."""

    attack: str
    canary_kind: str
    template: str
    position: int
    partition_seed: int
    canary: Example
    replacement: Example
    exemplars_c0: tuple[Example, ...]
    query: str
    y1: str
    y0: str
    signal: str
    repeat_suffix: str | None = None
    e1: tuple[float, ...] | None = None
    e0: tuple[float, ...] | None = None
    embeddings_source: str | None = None
    layout: str = "paper"  # "paper", "pivotal" or "identical" (.build)

    @property
    def positive(self) -> str:
        return self.y1

    @property
    def negative(self) -> str:
        return self.y0

    def decide_text(self, text: str) -> int:
        """Black-box rule: 1 ("present") when the released text is y1 (Section 3.4; the
        identical design: its first line, as a model continues past the copied output); for
        the Repeat baseline, when it contains the canary's hidden second half."""
        if self.attack == "repeat":
            return int(bool(self.repeat_suffix) and _norm_text(self.repeat_suffix or "")
                       in _norm_text(text))  # fmt: skip
        return int(self.signal_text(text) == self.y1)

    def signal_text(self, text: str) -> str:
        """The part of a released text compared with y1 and y0."""
        t = text.strip()
        return t.split("\n", 1)[0].strip() if self.layout == "identical" else t

    def signal_embeddings(self) -> tuple[FloatArray, FloatArray] | None:
        if self.e1 is None or self.e0 is None:
            return None
        return np.asarray(self.e1, dtype=np.float64), np.asarray(self.e0, dtype=np.float64)

    def score(self, noisy_mean: npt.ArrayLike) -> float:
        emb = self.signal_embeddings()
        if emb is None:
            raise InvalidAuditInput("the signal embeddings e(y1), e(y0) are not known yet")
        return esa_score(noisy_mean, emb[0], emb[1])

    def signal_distance(self) -> float | None:
        """||e(y1) - e(y0)||, when the embeddings are known."""
        emb = self.signal_embeddings()
        return None if emb is None else float(np.linalg.norm(emb[0] - emb[1]))

    def with_embeddings(self, e1: FloatArray, e0: FloatArray, source: str) -> GenerationDesign:
        return replace(
            self,
            e1=tuple(float(x) for x in e1),
            e0=tuple(float(x) for x in e0),
            embeddings_source=source,
        )

    def to_json(self) -> JsonObject:
        return pair_to_json(self) | {"design_kind": "generation"}

    @classmethod
    def from_json(cls, data: JsonMapping) -> GenerationDesign:
        d = pair_from_json(data)
        for key in ("e1", "e0"):
            if d.get(key) is not None:
                d[key] = tuple(float(x) for x in d[key])
        return cls(**d)
