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
from typing import Any

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.counts import estimate_from_counts
from dpicl_audit.jsontypes import JsonObject

__all__ = ["FamilyWise", "family_wise_figures", "figure_tests"]

_COUNTS = ("tp", "fn", "fp", "tn")


@dataclass(frozen=True, slots=True)
class FamilyWise:
    """A figure's bounds with every test's error divided by ``size``."""

    size: int
    mu_lower: float
    epsilon_lower_classic: float

    def to_dict(self) -> JsonObject:
        return asdict(self)


def figure_tests(est: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The tests behind an estimate's GDP figure: a white-box estimate's black-box and
    held-out tests (it reports the better), else the estimate itself (its counts)."""
    if "chosen" in est:  # WhiteBoxEstimate.to_dict
        return [t for t in (est.get("black_box"), est.get("held_out")) if t]
    return [est]


def _at(test: Mapping[str, Any], size: int, delta: float) -> tuple[float, float] | None:
    if any(not isinstance(test.get(k), int) for k in _COUNTS) or "confidence" not in test:
        return None
    alpha = (1.0 - float(test["confidence"])) / size
    try:
        e = estimate_from_counts(
            *(int(test[k]) for k in _COUNTS), delta=delta, confidence=1.0 - alpha
        )
    except InvalidAuditInput:
        return None
    return e.mu_lower, e.epsilon_lower_classic


def family_wise_figures(est: Mapping[str, Any], size: int, delta: float) -> FamilyWise | None:
    """``est``'s GDP and classical figures with each test at error ``(1 - c_i) / size``;
    None when a test's counts are not in the estimate (nothing can be re-evaluated).

    The classical figure's own tests are read from ``est["classical_tests"]`` where it has
    its own threshold (white-box), else they are the GDP figure's (same counts)."""
    if size < 1:
        raise InvalidAuditInput(f"a family has at least one figure, got size {size}")
    gdp = _all_at(figure_tests(est), size, delta)
    classical_tests: Sequence[Mapping[str, Any]] | None = est.get("classical_tests")
    classical = gdp if classical_tests is None else _all_at(classical_tests, size, delta)
    if gdp is None or classical is None:
        return None
    return FamilyWise(
        size=size,
        mu_lower=max(mu for mu, _ in gdp),
        epsilon_lower_classic=max(eps for _, eps in classical),
    )


def _all_at(
    tests: Sequence[Mapping[str, Any]], size: int, delta: float
) -> list[tuple[float, float]] | None:
    out = [v for v in (_at(t, size, delta) for t in tests) if v is not None]
    return out if out and len(out) == len(tests) else None
