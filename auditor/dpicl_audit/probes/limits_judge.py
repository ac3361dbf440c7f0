"""The limits probe's test (:mod:`.limits`, its docstring): each observed field of the
refusals, per query size and with every size pooled, compared between the worlds by Fisher's
exact test, Bonferroni-corrected over every test."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

__all__ = ["FIELDS", "Finding", "Outcome", "is_refusal", "judge"]

#: What is compared per request (refused or not, status, code, message) and per size and
#: world (whether refusals were charged).
FIELDS = ("refused", "status", "code", "message", "charged")

#: One request's outcome: (status, error code, normalised message); status 0 where the
#: connection failed, code and message empty for an answer.
Outcome = tuple[int, str, str]


def is_refusal(outcome: Outcome) -> bool:
    return outcome[0] >= 400 or outcome[0] == 0


def _fisher(ones: Sequence[Any], zeros: Sequence[Any]) -> float:
    """Fisher's exact test (two-sided) of the worlds' shares of the pooled most common value;
    1 where a world has none or only one value occurs."""
    if not ones or not zeros:
        return 1.0
    pooled = Counter([*ones, *zeros])
    if len(pooled) < 2:
        return 1.0
    top = max(sorted(pooled, key=str), key=lambda v: pooled[v])
    a, b = sum(v == top for v in ones), sum(v == top for v in zeros)
    table = [[a, len(ones) - a], [b, len(zeros) - b]]
    return float(stats.fisher_exact(table).pvalue)


def _field_values(got: Sequence[Outcome], charged: int | None) -> dict[str, list[Any]]:
    refused = [g for g in got if is_refusal(g)]
    n_charged = 0 if charged is None else min(charged, len(refused))
    return {
        "refused": [is_refusal(g) for g in got],
        "status": [g[0] for g in refused],
        "code": [g[1] for g in refused],
        "message": [g[2] for g in refused],
        # which refusals were charged is not observed, only how many: the count is what is
        # compared (charged ones first; Fisher's test reads only the count)
        "charged": [] if charged is None else [i < n_charged for i in range(len(refused))],
    }


@dataclass(frozen=True, slots=True)
class Finding:
    """The smallest p-value of the probe's tests, Bonferroni-corrected over ``tests``."""

    p_value: float
    #: the query size it was found at; None: every size pooled
    size: int | None
    field: str
    tests: int


def judge(
    sizes: Sequence[tuple[int, Mapping[int, Sequence[Outcome]], Mapping[int, Any]]],
) -> Finding | None:
    """The test of the module docstring over ``(query chars, outcomes per world, charged
    refusals per world)`` per size: each field at each size, and each field with every size
    pooled (a refusal that depends on the world only sometimes, at many sizes: pooling
    strata with as many requests per world in each keeps Fisher's test conservative, its
    variance under the null being at least the stratified one's). None where no size was
    asked."""
    tests: list[tuple[float, int | None, str]] = []
    pooled: dict[int, dict[str, list[Any]]] = {
        1: {f: [] for f in FIELDS},
        0: {f: [] for f in FIELDS},
    }
    for chars, outcomes, charged in sizes:
        values = {w: _field_values(outcomes[w], charged[w]) for w in (1, 0)}
        tests += [(_fisher(values[1][f], values[0][f]), chars, f) for f in FIELDS]
        for w in (1, 0):
            for f in FIELDS:
                pooled[w][f] += values[w][f]
    if not tests:
        return None
    if len(sizes) > 1:
        tests += [(_fisher(pooled[1][f], pooled[0][f]), None, f) for f in FIELDS]
    p, at, field = min(tests, key=lambda t: t[0])
    return Finding(min(1.0, p * len(tests)), at, field, len(tests))
