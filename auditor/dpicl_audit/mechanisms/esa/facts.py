"""ESA's own facts of a setting (:class:`EsaFacts`): the mean's sensitivity bound and the
canary's signal geometry beside what every Gaussian mechanism reports
(:class:`~dpicl_audit.mechanisms.gaussian.GaussianFacts`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dpicl_audit.claims import number
from dpicl_audit.jsontypes import JsonObject, JsonValue
from dpicl_audit.mechanisms.gaussian import GaussianFacts

__all__ = ["EsaFacts"]


@dataclass(frozen=True)
class EsaFacts(GaussianFacts):
    """The Gaussian facts, and: the sensitivity bound of the mean over T partitions (2/T,
    or 1: paper 000, Appendix A), the signal pair's name, the distance ``||e(y1) - e(y0)||``
    (None before the embeddings are learnt) and the canary's shift ``D / T``; for the
    membership attack the design's clean gaps (:func:`~.build.esa_design_gaps`)."""

    sensitivity_bound: float
    signal: str
    signal_distance: float | None
    design_gaps: tuple[int, int] | None = None

    @property
    def signal_shift(self) -> float | None:
        return None if self.signal_distance is None else self.signal_distance / self.partitions

    def to_json(self) -> JsonObject:
        out = super().to_json() | {
            "mechanism": "esa",
            "sensitivity_bound": self.sensitivity_bound,
            "signal": self.signal,
            "signal_distance": self.signal_distance,
            "signal_shift": self.signal_shift,
        }
        if self.design_gaps is not None:
            out["design_gaps"] = list(self.design_gaps)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> EsaFacts:
        """ESA's facts from a stored setting's keys."""
        gaps = data.get("design_gaps")
        base = GaussianFacts.from_json(data)
        return cls(
            base.partitions,
            base.calibration,
            base.design,
            sensitivity_bound=float(number(data.get("sensitivity_bound")) or 0.0),
            signal=str(data.get("signal")),
            signal_distance=number(data.get("signal_distance")),
            design_gaps=_gaps(gaps),
        )


def _gaps(stored: JsonValue) -> tuple[int, int] | None:
    """The stored ``design_gaps`` ([with the canary, without]), None where not stored."""
    if not isinstance(stored, list) or len(stored) != 2:
        return None
    with_gap, without_gap = (int(number(g) or 0) for g in stored)
    return with_gap, without_gap
