"""The utility audit's results, typed (docs/utility.md): a row per cell
(:class:`UtilityRow`), a finding per degenerate cell (:class:`Finding`), and the whole
(:class:`UtilityResults`, ``utility.json`` and the run's stored results). TypedDicts: they
are written as JSON exactly as built, and a stored run's results read back as they were."""

from __future__ import annotations

from typing import Required, TypedDict

__all__ = [
    "Finding",
    "IntervalJson",
    "UtilityResults",
    "UtilityRow",
    "VsMajority",
    "metric_of",
]


class IntervalJson(TypedDict):
    """An accuracy or ROUGE-L interval as written (``utility.estimators.Interval.to_json``)."""

    value: float
    low: float
    high: float
    n: int
    confidence: float
    method: str


class VsMajority(TypedDict):
    """A cell's one-sided exact binomial test against the majority-class rate."""

    p_value: float
    above: bool
    rate: float


class UtilityRow(TypedDict, total=False):
    """One cell of the grid (a baseline, or a private cell at (epsilon, T))."""

    setting: Required[str]
    kind: Required[str]
    epsilon: Required[float | None]
    partitions: Required[int | None]
    queries: Required[int]
    planned: Required[int]
    measured_by: str
    refused: str
    accuracy: IntervalJson
    rouge_l: IntervalJson
    #: What it answered, label by count (classification).
    answers: dict[str, int]
    spent_epsilon: float | None
    contexts: int
    #: The majority row's constant answer.
    label: str
    vs_majority: VsMajority


class Finding(TypedDict, total=False):
    """A cell that answers one label to nearly everything, or is no better than it."""

    setting: Required[str]
    kind: Required[str]
    message: Required[str]
    label: str
    share: float
    p_value: float


class UtilityResults(TypedDict, total=False):
    """A utility run's results."""

    kind: str
    task: str | None
    metric: str
    mechanism: str
    dataset: str
    label_calibration: str | None
    delta: float
    cells: list[UtilityRow]
    spent_epsilon_per_exemplar: float | None
    refused: dict[str, str]
    findings: list[Finding]
    degenerate: str | None
    run_id: str
    contexts_deleted: int


def metric_of(row: UtilityRow, metric: str | None) -> IntervalJson | None:
    """A row's interval of the run's ``metric`` (``accuracy``, else ROUGE-L)."""
    return row.get("accuracy") if metric == "accuracy" else row.get("rouge_l")
