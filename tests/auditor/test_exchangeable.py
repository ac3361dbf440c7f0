"""The model-free independence test of repeated answers (estimators.exchangeable): valid under
exchangeability (checked against exhaustive enumeration and by simulation), powerful against
answers that repeat in runs, silent where order cannot carry information.

False-failure rates: the simulations use fixed seeds, so each test is deterministic; the
bounds they check would fail for a fresh seed with the probability stated at each."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.exchangeable import (
    _expected_repeats,
    adjacent_repeats,
    order_can_inform,
    repeat_test,
)


def _exact_p(seq: list[int]) -> tuple[float, float]:
    """P(repeats >= observed) and E[repeats] over all orders of ``seq`` (enumerated)."""
    obs = int(adjacent_repeats(np.array(seq)))
    counts = [int(adjacent_repeats(np.array(p))) for p in itertools.permutations(seq)]
    return float(np.mean([c >= obs for c in counts])), float(np.mean(counts))


@pytest.mark.parametrize(
    "seq", [[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1, 2, 2], [0, 0, 1, 1, 0, 2, 2, 1]]
)
def test_p_value_and_mean_match_enumeration(seq: list[int]) -> None:
    exact, mean = _exact_p(seq)
    assert _expected_repeats(np.bincount(seq)) == pytest.approx(mean, rel=1e-12)
    test = repeat_test(seq, alpha=1e-4, rng=np.random.default_rng(3), name="t")
    assert test is not None
    # Besag-Clifford stops at 20 exceedances: p_hat = 20 / L, L ~ NegBin(20, p). The ratio
    # p_hat / p lies in [0.5, 2] but for P(Poisson(40) < 20) + P(Poisson(10) >= 20), ~0.4%;
    # where sampling ran to the end (p small), p_hat is (1 + g) / (1 + M), within 3 sd.
    assert 0.5 * exact <= test.p_value <= 2.0 * exact + 1e-3, (test, exact)


def test_valid_under_exchangeability() -> None:
    """Honest answers (i.i.d. from skewed and flat distributions, 20 to 300 per world): the
    rejection rate at 0.05 is at most 0.05. Checked against the binomial's 1 - 1e-4 upper
    quantile for 400 runs (false failure < 1e-4 for a valid test)."""
    rng = np.random.default_rng(11)
    rejected = 0
    runs = 400
    for i in range(runs):
        n = int(rng.integers(20, 300))
        k = int(rng.integers(2, 8))
        probs = rng.dirichlet(np.full(k, 0.5 if i % 2 else 5.0))
        seq = list(rng.choice(k, size=n, p=probs))
        t = repeat_test(seq, alpha=0.05, rng=rng, name="t")
        rejected += t is not None and t.p_value <= 0.05
    assert rejected <= stats.binom.ppf(1 - 1e-4, runs, 0.05), rejected


def test_runs_of_repeated_answers_are_found() -> None:
    """Answers shared by blocks of 4 consecutive trials (a seed per batch): p at its floor."""
    rng = np.random.default_rng(5)
    draws = rng.integers(0, 6, size=50)
    seq = [int(d) for d in np.repeat(draws, 4)]
    t = repeat_test(seq, alpha=1e-4, rng=rng, name="C1 answers in trial order")
    assert t is not None and t.what == "independence"
    assert t.p_value < 1e-4 and t.statistic >= 150
    assert "adjacent answers identical" in t.detail and t.df == len(set(seq)) - 1


def test_silent_where_order_carries_nothing() -> None:
    rng = np.random.default_rng(0)
    assert not order_can_inform(["a", "a", "a", "a"]) and not order_can_inform(["a", "b"])
    assert repeat_test(["same text"] * 50, alpha=1e-3, rng=rng, name="t") is None
    assert repeat_test(["x", "y"], alpha=1e-3, rng=rng, name="t") is None


@pytest.mark.parametrize("alpha", [0.0, 1.0, -1e-3, math.nan])
def test_bad_alpha_is_named(alpha: float) -> None:
    with pytest.raises(InvalidAuditInput, match="alpha"):
        repeat_test(["a", "b", "a"], alpha=alpha, rng=np.random.default_rng(0), name="t")


def test_seeded_generator_reproduces_the_p_value() -> None:
    seq = ["a", "b", "a", "a", "c", "b", "b", "a", "c", "c"] * 5
    one = repeat_test(seq, alpha=1e-3, rng=np.random.default_rng([7, 1]), name="t")
    two = repeat_test(seq, alpha=1e-3, rng=np.random.default_rng([7, 1]), name="t")
    assert one == two
