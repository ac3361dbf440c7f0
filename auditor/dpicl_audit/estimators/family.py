"""Family-wise figures: a run's claims held together at its confidence (Bonferroni).

A run reports several figures (every epsilon setting, black-box and, where it ran, white-box),
each a lower bound at the plan's confidence ``c``. A claim read off any one of them
(VIOLATION, BUG) is wrong for at most ``1 - c`` of runs of a correct server *per figure*, so
over a run's ``m`` figures for up to ``m (1 - c)`` of them. A run therefore states such a
claim only where the figure still exceeds with every statistical test behind it re-evaluated
from its logged counts at error ``(1 - c_i) / m`` instead of ``1 - c_i``
(:func:`family_wise_figures`); by the union bound all of the run's claims then hold together
at ``c``. The figures shown stay the per-figure ones: each is the bound the audit has for
that setting.

A figure's tests: the black-box rule's counts (one test); a white-box figure's two tests
(the black-box rule and the held-out threshold, each at its share of the error,
:func:`~dpicl_audit.estimators.whitebox.whitebox_estimate`), of which the figure is the
better; a bootstrap's held-out threshold. Each test's dict carries its counts and the
confidence it was evaluated at, so re-evaluating it at a stricter level needs no trials.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict, cast

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.counts import estimate_from_counts
from dpicl_audit.jsontypes import JsonObject

__all__ = [
    "FamilyWise",
    "FigureRecord",
    "FigureTest",
    "family_wise_figures",
    "figure_record",
    "figure_tests",
]


class FigureTest(TypedDict, total=False):
    """One statistical test behind a figure as an estimate carries it: its decision counts
    and trials per world (None or absent where it has none) and the confidence it was
    evaluated at (estimators.counts, estimators.whitebox)."""

    tp: int | None
    fn: int | None
    fp: int | None
    tn: int | None
    n_pos: int | None
    n_neg: int | None
    confidence: float | None


class FigureRecord(FigureTest, total=False):
    """An estimate's figure as the family-wise and power rules read it: its own test's keys
    and, for a white-box figure (``chosen`` set), its two tests; the classical figure's own
    tests where it has its own threshold; the bounds the verdict rules compare."""

    chosen: str | None
    black_box: FigureTest | None
    held_out: FigureTest | None
    classical_tests: list[FigureTest] | None
    mu_lower: float | None
    epsilon_lower_classic: float | None


def figure_record(estimate: Mapping[str, object]) -> FigureRecord:
    """An estimate's mapping (``Estimate.as_mapping()``, a stored setting's ``black_box``,
    a white-box estimate's ``to_dict()``) read as its figure: the keys
    :class:`FigureRecord` names, as the estimators wrote them (the rules below check each
    count before they use it); its other keys stay, so a test kept from it is stored whole
    (``classical_tests``)."""
    return cast(FigureRecord, dict(estimate))


@dataclass(frozen=True, slots=True)
class FamilyWise:
    """A figure's bounds with every test's error divided by ``size``."""

    size: int
    mu_lower: float
    epsilon_lower_classic: float

    def to_dict(self) -> JsonObject:
        return asdict(self)


def figure_tests(est: FigureRecord) -> list[FigureTest]:
    """The tests behind an estimate's GDP figure: a white-box estimate's black-box and
    held-out tests (it reports the better), else the estimate itself (its counts)."""
    if "chosen" in est:  # WhiteBoxEstimate.to_dict
        return [t for t in (est.get("black_box"), est.get("held_out")) if t]
    return [est]


def _at(test: FigureTest, size: int, delta: float) -> tuple[float, float] | None:
    tp, fn, fp, tn = test.get("tp"), test.get("fn"), test.get("fp"), test.get("tn")
    conf = test.get("confidence")
    if tp is None or fn is None or fp is None or tn is None or conf is None:
        return None
    alpha = (1.0 - float(conf)) / size
    try:
        e = estimate_from_counts(tp, fn, fp, tn, delta=delta, confidence=1.0 - alpha)
    except InvalidAuditInput:
        return None
    return e.mu_lower, e.epsilon_lower_classic


def family_wise_figures(est: FigureRecord, size: int, delta: float) -> FamilyWise | None:
    """``est``'s GDP and classical figures with each test at error ``(1 - c_i) / size``;
    None when a test's counts are not in the estimate (nothing can be re-evaluated).

    The classical figure's own tests are read from ``est["classical_tests"]`` where it has
    its own threshold (white-box), else they are the GDP figure's (same counts)."""
    if size < 1:
        raise InvalidAuditInput(f"a family has at least one figure, got size {size}")
    gdp = _all_at(figure_tests(est), size, delta)
    classical_tests = est.get("classical_tests")
    classical = gdp if classical_tests is None else _all_at(classical_tests, size, delta)
    if gdp is None or classical is None:
        return None
    return FamilyWise(
        size=size,
        mu_lower=max(mu for mu, _ in gdp),
        epsilon_lower_classic=max(eps for _, eps in classical),
    )


def _all_at(
    tests: Sequence[FigureTest], size: int, delta: float
) -> list[tuple[float, float]] | None:
    out = [v for v in (_at(t, size, delta) for t in tests) if v is not None]
    return out if out and len(out) == len(tests) else None
