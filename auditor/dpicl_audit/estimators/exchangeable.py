"""Repeated answers to one query are exchangeable: a model-free conformance test (issue 27).

An audit asks the same query of identical contexts, trial after trial, and an honest server
draws fresh randomness for every answer (dpicl seeds each request from the OS's entropy). So
the answers of one world are independent and identically distributed, whatever the model's
distribution is: every order of them is as likely as the order observed. That is a
prediction a black-box audit can test without knowing the model, which matters where the
design predicts no release distribution (DPS-MOZO, whose answers are the model's text).

A server whose randomness is shared between answers breaks it: a generator seeded by the
clock (answers within one second are identical), an answer cache, noise reused until a
counter moves. Such a server releases runs of identical answers next to each other.

* **Statistic:** the number of adjacent trials (in trial order, one world) whose answers are
  identical.
* **Null distribution:** the same count over uniformly random orders of the observed answers
  (a permutation test, exact under exchangeability). It is sampled by Monte Carlo with the
  sequential stopping of Besag and Clifford (1991): sampling stops once ``h`` permuted counts
  reach the observed one (p = h / L after L permutations), else after ``M`` permutations
  (p = (1 + g) / (1 + M), Phipson and Smyth 2010). Both p-values are valid at every sample
  size; ``M`` is chosen from the test's error so that a departure can be seen
  (the smallest reachable p is a tenth of the error).
* **Degrees of freedom:** none are assumed. A world whose answers are all identical has one
  order only, so the test could not see a departure there and is not run (a world of fewer
  than 3 answers neither).

The generator is passed in, seeded from the run's plan, so recomputing a run's results from its
log gives the same p-values.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.conformance import ConformanceTest

__all__ = ["adjacent_repeats", "order_can_inform", "repeat_test"]

#: Besag-Clifford's stopping count: enough exceedances that p is clearly above any error.
_STOP_AFTER = 20
_CHUNK = 2048


def adjacent_repeats(codes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The number of adjacent identical entries along the last axis."""
    return np.asarray(np.sum(codes[..., 1:] == codes[..., :-1], axis=-1), dtype=np.int64)


def order_can_inform(answers: Sequence[Hashable]) -> bool:
    """Whether the order of ``answers`` can carry information: at least 3, not all equal."""
    return len(answers) >= 3 and len(set(answers)) > 1


def repeat_test(
    answers: Sequence[Hashable],
    *,
    alpha: float,
    rng: np.random.Generator,
    name: str,
    max_permutations: int = 1_000_000,
) -> ConformanceTest | None:
    """The permutation test of ``answers`` (in trial order) against exchangeability, sized
    for error ``alpha``; None where it is not :func:`order_can_inform`."""
    if not 0.0 < alpha < 1.0:
        raise InvalidAuditInput(f"alpha must lie in (0, 1), got {alpha!r}")
    if not order_can_inform(answers):
        return None
    _, inverse = np.unique(np.array([repr(a) for a in answers]), return_inverse=True)
    codes = inverse.astype(np.int64)
    observed = int(adjacent_repeats(codes))
    m = min(max_permutations, max(1000, math.ceil(10.0 / alpha)))
    seen = reached = 0
    while seen < m and reached < _STOP_AFTER:
        size = min(_CHUNK, m - seen)
        perms = rng.permuted(np.broadcast_to(codes, (size, codes.size)), axis=1)
        hits = np.flatnonzero(adjacent_repeats(perms) >= observed)
        if reached + hits.size >= _STOP_AFTER:
            # Stop at the permutation that made the h-th exceedance (Besag-Clifford).
            seen += int(hits[_STOP_AFTER - reached - 1]) + 1
            reached = _STOP_AFTER
            break
        seen += size
        reached += hits.size
    p = reached / seen if reached >= _STOP_AFTER else (1 + reached) / (1 + seen)
    n, distinct = len(answers), int(codes.max()) + 1
    expected = _expected_repeats(np.bincount(codes))
    return ConformanceTest(
        what="independence",
        name=name,
        p_value=float(min(1.0, p)),
        statistic=float(observed),
        df=distinct - 1,
        detail=(
            f"{observed} of {n - 1} adjacent answers identical, {expected:.1f} expected in a "
            f"random order ({distinct} distinct answers; {seen} permutations)"
        ),
    )


def _expected_repeats(counts: npt.NDArray[np.int64]) -> float:
    """E[adjacent identical pairs] over random orders: (n - 1) sum c(c - 1) / (n (n - 1))."""
    n = int(counts.sum())
    return float(np.sum(counts * (counts - 1)) / n)
