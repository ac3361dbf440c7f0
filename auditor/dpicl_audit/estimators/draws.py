"""Conformance of sampled releases: was each released token drawn from the distribution the
server reports? (issue 27, DPS-MOZO)

DPS-MOZO's privacy is a property of the distribution a token is *sampled* from (paper 004,
Algorithm 1, line 9; docs/privacy.md's proven mode). A server can report the right
distribution at the white-box endpoint and still release something else: the greedy argmax,
a draw from the clean one-shot distribution, a token sampled with a reused seed. The bound
on epsilon then audits a distribution that was never used. The design predicts exactly what
is released, given what is reported: the token is one draw from ``product_probs``.

The test is the randomised probability integral transform (Brockwell 2007; Czado, Gneiting
and Held 2009, "Predictive model assessment for count data", Section 2.1). Order the support
by decreasing reported probability (ties by token id, which only fixes a convention: any
fixed order is exact), and for the released token ``y`` at position ``j`` let

    u = F(j - 1) + V * p(y),   V ~ Uniform(0, 1) independent,

where ``F`` is the cumulative reported probability. Under the prediction every ``u`` is
exactly Uniform(0, 1), and draws of different answers are independent, so a two-sided
Kolmogorov-Smirnov test of the ``u`` against the uniform is exact in its null (no
approximation in the discreteness of the support). A greedy server puts every ``u`` below
``p_max``; a sharper or flatter distribution than reported skews them low or high.

``V`` comes from a generator seeded by the caller (the setting's name), so that a run's
results are the same each time they are computed from its log: it is the test's own
randomisation, not a noise draw of any mechanism.

A second test counts the answers that released the reported mode. Under the prediction
the count is Poisson-binomial with the modes' probabilities (computed exactly by
convolution); a greedy server releases the mode every time, a flattened one too rarely. It
is the more powerful of the two where the reported distributions are peaked (a greedy server
departs from sampling only where the mode is not drawn).

A token released with a reported probability of 0, or outside the reported support, is a
certain departure (p-value 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpicl_audit.estimators.conformance import ConformanceTest

__all__ = ["MIN_DRAWS", "Draw", "pit_values", "poisson_binomial_two_sided", "sampling_tests"]

MIN_DRAWS = 5
"""Fewer draws than this give no sampling test (the KS test has almost no power there)."""


@dataclass(frozen=True, slots=True)
class Draw:
    """One released token and the distribution the server says it was drawn from."""

    token_id: int
    support: tuple[int, ...]
    probs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.support) != len(self.probs) or not self.support:
            raise ValueError(
                f"a draw needs one probability per support token: {len(self.support)} "
                f"tokens, {len(self.probs)} probabilities"
            )


def pit_values(draws: Sequence[Draw], rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """The randomised PIT value of each draw (module docstring), and how many draws released
    a token the reported distribution gives no probability (those get no value)."""
    out: list[float] = []
    impossible = 0
    for d in draws:
        p = np.clip(np.asarray(d.probs, dtype=float), 0.0, None)
        total = p.sum()
        ids = np.asarray(d.support)
        if total <= 0 or d.token_id not in d.support:
            impossible += 1
            continue
        p = p / total
        order = np.lexsort((ids, -p))  # decreasing probability, then token id
        p, ids = p[order], ids[order]
        j = int(np.flatnonzero(ids == d.token_id)[0])
        if p[j] <= 0:
            impossible += 1
            continue
        below = float(p[:j].sum())
        out.append(min(below + float(rng.uniform()) * float(p[j]), 1.0))
    return np.asarray(out), impossible


def _mode_probabilities(draws: Sequence[Draw]) -> tuple[np.ndarray, int]:
    """Each draw's reported mode probability, and how many draws released their mode."""
    p_mode, hits = [], 0
    for d in draws:
        p = np.clip(np.asarray(d.probs, dtype=float), 0.0, None)
        p = p / p.sum()
        ids = np.asarray(d.support)
        order = np.lexsort((ids, -p))
        p_mode.append(float(p[order[0]]))
        hits += int(ids[order[0]] == d.token_id)
    return np.asarray(p_mode), hits


def poisson_binomial_two_sided(k: int, probs: np.ndarray) -> float:
    """Two-sided p-value of ``k`` successes of independent Bernoulli(``probs``): twice the
    smaller tail, from the exact distribution (dynamic-programming convolution)."""
    pmf = np.zeros(len(probs) + 1)
    pmf[0] = 1.0
    for i, p in enumerate(probs):
        pmf[1 : i + 2] = pmf[1 : i + 2] * (1.0 - p) + pmf[: i + 1] * p
        pmf[0] *= 1.0 - p
    low, high = float(pmf[: k + 1].sum()), float(pmf[k:].sum())
    return min(1.0, 2.0 * min(low, high))


def sampling_tests(draws: Sequence[Draw], rng: np.random.Generator) -> list[ConformanceTest]:
    """The released tokens against the reported distributions: a two-sided KS test of the
    randomised PIT and the exact count of released modes, or a certain departure where a
    token had reported probability 0. No test (``[]``) below :data:`MIN_DRAWS` draws."""
    if len(draws) < MIN_DRAWS:
        return []
    u, impossible = pit_values(draws, rng)
    if impossible:
        return [
            ConformanceTest(
                what="sampling",
                name="released token in the reported support",
                p_value=0.0,
                statistic=float(impossible),
                df=len(draws),
                detail=(
                    f"{impossible} of {len(draws)} released first tokens have reported "
                    "probability 0 (or are outside the reported top-k support)"
                ),
            )
        ]
    ks = stats.kstest(u, "uniform")
    mean = float(u.mean())
    p_mode, hits = _mode_probabilities(draws)
    expected = float(p_mode.sum())
    return [
        ConformanceTest(
            what="sampling",
            name="released token drawn from product_probs (randomised PIT, KS)",
            p_value=float(ks.pvalue),
            statistic=float(ks.statistic),
            df=len(u),
            detail=(
                f"{len(u)} first tokens; the PIT values' mean is {mean:.3f} (0.5 expected; "
                "low: the server releases likelier tokens than it reports, e.g. greedy)"
            ),
        ),
        ConformanceTest(
            what="sampling",
            name="released modes (exact Poisson-binomial count)",
            p_value=poisson_binomial_two_sided(hits, p_mode),
            statistic=float(hits),
            df=len(draws),
            detail=(
                f"{hits} of {len(draws)} first tokens are the reported mode, {expected:.1f} "
                "expected (all of them: a greedy server)"
            ),
        ),
    ]
