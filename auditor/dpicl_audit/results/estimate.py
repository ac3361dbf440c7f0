"""One threat model's estimate of a setting (:class:`Estimate`): its counts, lower bounds and
verdict, or the error that stopped it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dpicl_audit.estimators.family import FigureRecord, figure_record
from dpicl_audit.results.record import COUNT, NUMBER, TEXT, VERDICT, Codec, Record
from dpicl_audit.verdicts import Status, Verdict

__all__ = ["Estimate"]


@dataclass(frozen=True)
class Estimate(Record):
    """One threat model's estimate of a setting: its counts, lower bounds and verdict
    (:mod:`~dpicl_audit.estimators.counts`, :mod:`~dpicl_audit.estimators.whitebox`), or
    the ``error`` that stopped it. The figures a mechanism adds (thresholds, held-out
    splits, the ROC) are in ``extra``."""

    tp: int | None = None
    fn: int | None = None
    fp: int | None = None
    tn: int | None = None
    confidence: float | None = None
    delta: float | None = None
    mu_lower: float | None = None
    epsilon_lower: float | None = None
    epsilon_lower_classic: float | None = None
    epsilon_emp: float | None = None
    tpr: float | None = None
    fpr: float | None = None
    verdict: Verdict | None = None
    error: str | None = None

    CODECS: ClassVar[dict[str, Codec]] = (
        dict.fromkeys(("tp", "fn", "fp", "tn"), COUNT)
        | dict.fromkeys(
            (
                "confidence",
                "delta",
                "mu_lower",
                "epsilon_lower",
                "epsilon_lower_classic",
                "epsilon_emp",
                "tpr",
                "fpr",
            ),
            NUMBER,
        )
        | {"error": TEXT, "verdict": VERDICT}
    )

    @property
    def counts(self) -> tuple[int, int, int, int] | None:
        """(tp, fn, fp, tn), where the estimate has all four decision counts."""
        tp, fn, fp, tn = self.tp, self.fn, self.fp, self.tn
        if tp is None or fn is None or fp is None or tn is None:
            return None
        return tp, fn, fp, tn

    @property
    def status(self) -> str:
        """The verdict's status; ``error`` for an estimate that failed, "" for one with no
        verdict (as the report's rows read it)."""
        if self.error is not None:
            return Status.ERROR.value
        return "" if self.verdict is None else self.verdict.status.value

    @property
    def epsilon_shown(self) -> float | None:
        """The epsilon the table shows: epsilon_emp where the mechanism states one, else the
        GDP lower bound."""
        return self.epsilon_emp if "epsilon_emp" in self.keys else self.epsilon_lower

    def figure_record(self) -> FigureRecord:
        """The figure the family-wise and power rules read (its tests' counts and
        confidences, a white-box figure's two tests, the bounds): the keys of
        :class:`~dpicl_audit.estimators.family.FigureRecord` among its stored ones."""
        return figure_record(self.as_mapping())
