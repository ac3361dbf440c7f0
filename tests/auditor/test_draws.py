"""The sampling conformance test of DPS-MOZO's releases (``estimators/draws.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpicl_audit.estimators.draws import (
    MIN_DRAWS,
    Draw,
    pit_values,
    poisson_binomial_two_sided,
    sampling_tests,
)


def _honest(rng: np.random.Generator, n: int, k: int = 20, conc: float = 0.3) -> list[Draw]:
    draws = []
    for _ in range(n):
        p = rng.dirichlet(np.full(k, conc))
        ids = tuple(int(i) for i in rng.choice(10_000, size=k, replace=False))
        y = ids[int(rng.choice(k, p=p))]
        draws.append(Draw(y, ids, tuple(float(x) for x in p)))
    return draws


def test_pit_is_uniform_for_honest_draws_even_on_a_tiny_support() -> None:
    # Two tokens at 0.9/0.1: without the randomisation the PIT would take two values only.
    rng = np.random.default_rng(1)
    draws = [Draw(int(rng.random() < 0.1), (0, 1), (0.9, 0.1)) for _ in range(4000)]
    u, impossible = pit_values(draws, np.random.default_rng(2))
    assert impossible == 0
    # KS at 4000 draws: a false failure at p < 1e-4 happens once in 10^4 seeds.
    assert stats.kstest(u, "uniform").pvalue > 1e-4


def test_honest_false_alarm_rate_is_the_nominal_one() -> None:
    # 300 honest settings of 60 draws: the count of p < 0.05 is Binomial(300, 0.05) (mean
    # 15); failing above 36 has probability < 1e-6 under the exact null.
    rng = np.random.default_rng(3)
    for which in (0, 1):  # the PIT's KS test, the count of released modes
        below = sum(sampling_tests(_honest(rng, 60), rng)[which].p_value < 0.05 for _ in range(300))
        # The mode count is discrete: its two-sided test is conservative (at most 5%).
        assert below <= 36, (which, below)
    assert stats.binom.sf(36, 300, 0.05) < 1e-6


def test_greedy_release_is_caught() -> None:
    rng = np.random.default_rng(4)
    draws = []
    for d in _honest(rng, 80, conc=1.0):
        top = d.support[int(np.argmax(d.probs))]
        draws.append(Draw(top, d.support, d.probs))
    pit, modes = sampling_tests(draws, rng)
    assert pit.what == modes.what == "sampling" and pit.p_value < 1e-6, pit
    assert modes.statistic == 80 and modes.p_value < 1e-6, modes


def test_a_sharper_distribution_than_reported_is_caught() -> None:
    # The server reports p but samples from p^3 renormalised (a temperature of 1/3).
    rng = np.random.default_rng(5)
    draws = []
    for d in _honest(rng, 300, conc=1.0):
        q = np.asarray(d.probs) ** 3
        q /= q.sum()
        draws.append(Draw(d.support[int(rng.choice(len(q), p=q))], d.support, d.probs))
    pit, modes = sampling_tests(draws, rng)
    assert pit.p_value < 1e-4 and modes.p_value < 1e-4, (pit, modes)


def test_a_token_outside_the_reported_support_is_a_certain_departure() -> None:
    rng = np.random.default_rng(6)
    draws = _honest(rng, 10)
    draws[3] = Draw(-1, draws[3].support, draws[3].probs)
    draws[4] = Draw(7, (7, 8), (0.0, 1.0))
    (t,) = sampling_tests(draws, rng)
    assert t.p_value == 0.0 and t.statistic == 2.0 and "2 of 10" in t.detail


def test_too_few_draws_give_no_test_and_bad_draws_are_refused() -> None:
    rng = np.random.default_rng(7)
    assert sampling_tests(_honest(rng, MIN_DRAWS - 1), rng) == []
    with pytest.raises(ValueError, match="2 tokens, 1 probabilities"):
        Draw(1, (1, 2), (1.0,))


def test_the_result_is_reproducible_from_the_seed() -> None:
    draws = _honest(np.random.default_rng(8), 40)
    a = sampling_tests(draws, np.random.default_rng(9))
    b = sampling_tests(draws, np.random.default_rng(9))
    assert a == b


def test_the_poisson_binomial_is_exact() -> None:
    # Equal probabilities: the binomial's own two-sided tails.
    p = np.full(40, 0.3)
    for k in (0, 5, 12, 20, 40):
        want = min(1.0, 2 * min(stats.binom.cdf(k, 40, 0.3), stats.binom.sf(k - 1, 40, 0.3)))
        assert poisson_binomial_two_sided(k, p) == pytest.approx(want, rel=1e-9)
    # Unequal: against enumeration of every outcome of 10 Bernoullis.
    rng = np.random.default_rng(10)
    q = rng.uniform(0.05, 0.95, size=10)
    outcomes = np.array(np.meshgrid(*[[0, 1]] * 10)).reshape(10, -1).T
    weight = np.prod(np.where(outcomes == 1, q, 1 - q), axis=1)
    totals = outcomes.sum(axis=1)
    for k in range(11):
        low, high = weight[totals <= k].sum(), weight[totals >= k].sum()
        assert poisson_binomial_two_sided(k, q) == pytest.approx(min(1, 2 * min(low, high)))
