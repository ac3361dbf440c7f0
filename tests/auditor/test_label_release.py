"""Exact epsilon of voting's released label and the pivotal canary design, against closed forms,
numerical integration and simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special, stats

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import classic_sigma
from dpicl_audit.estimators.label_release import (
    binary_release_epsilon,
    discrete_epsilon,
    label_release_epsilon,
    label_release_probabilities,
    pivotal_design,
    pivotal_rates,
    pivotal_votes,
)
from dpicl_audit.mechanisms.voting.exact import voting_epsilon_exact

DELTA = 1e-5


def _release_by_quadrature(votes: list[int], sigma: float, c: int) -> float:
    """P(label c wins) = int phi(z) prod_{j != c} Phi((h_c - h_j) / sigma + z) dz."""
    h = np.asarray(votes, dtype=float)
    others = np.delete(h, c)

    def f(z: float) -> float:
        return float(stats.norm.pdf(z) * np.prod(special.ndtr((h[c] - others) / sigma + z)))

    return float(integrate.quad(f, -np.inf, np.inf, epsabs=1e-13, epsrel=1e-11)[0])


def test_issue_example_exact_label_epsilon() -> None:
    # Issue 14: epsilon 8, votes (1, 3) against (0, 4): the released label's epsilon is 4.63.
    sigma = classic_sigma(8.0, DELTA)
    assert label_release_epsilon([1, 3], [0, 4], sigma, DELTA) == pytest.approx(4.63, abs=0.01)


@pytest.mark.parametrize("votes", [[1, 3], [0, 4], [3, 2], [5, 5], [2, 7]])
@pytest.mark.parametrize("sigma", [0.5, 1.7, 6.0])
def test_two_label_probabilities_match_quadrature(votes: list[int], sigma: float) -> None:
    p = label_release_probabilities(votes, sigma)
    assert p[0] == pytest.approx(_release_by_quadrature(votes, sigma, 0), abs=1e-9)
    assert p.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("votes", [[2, 1, 1], [0, 3, 1], [4, 0, 0, 1]])
def test_many_label_probabilities_match_quadrature(votes: list[int]) -> None:
    p = label_release_probabilities(votes, 1.3)
    for c in range(len(votes)):
        assert p[c] == pytest.approx(_release_by_quadrature(votes, 1.3, c), abs=1e-7)


@pytest.mark.parametrize(
    ("h1", "h0"), [([1, 3], [0, 4]), ([3, 2], [2, 3]), ([1, 7], [0, 8]), ([6, 0], [5, 1])]
)
@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0, 8.0])
def test_closed_form_equals_root_finding_and_never_exceeds_the_histogram(
    h1: list[int], h0: list[int], eps: float
) -> None:
    sigma = classic_sigma(eps, DELTA)
    p1 = label_release_probabilities(h1, sigma)
    p0 = label_release_probabilities(h0, sigma)
    closed = binary_release_epsilon(float(p1[0]), float(p0[0]), DELTA)
    assert closed == pytest.approx(discrete_epsilon(p1, p0, DELTA), abs=1e-9)
    # The label is a post-processing of the noisy histogram (Gaussian, sensitivity sqrt 2).
    assert closed <= voting_epsilon_exact(sigma, DELTA) + 1e-3


def test_discrete_epsilon_checks_its_definition() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
        e = discrete_epsilon(p, q, 1e-3)
        for a, b in ((p, q), (q, p)):
            assert np.sum(np.maximum(0, a - math.exp(e) * b)) <= 1e-3 + 1e-9
        if e > 0:  # and not smaller: some direction breaks delta just below it
            worst = max(
                np.sum(np.maximum(0, a - math.exp(e - 1e-6) * b)) for a, b in ((p, q), (q, p))
            )
            assert worst > 1e-3
    assert discrete_epsilon([0.5, 0.5, 0.0], [0.4, 0.4, 0.2], 1e-3) == math.inf


@pytest.mark.parametrize("t", [3, 5, 9, 17])
@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0, 8.0])
def test_pivotal_design_odd_t_has_the_mechanisms_mu(t: int, eps: float) -> None:
    m = t // 2
    with_votes, without_votes = pivotal_votes(t)
    assert (with_votes, without_votes) == ((m + 1, m), (m, m + 1))
    design = pivotal_design(t)
    assert len(design.other_labels) == t - 1
    assert design.other_labels.count(0) == m and design.other_labels.count(1) == m
    sigma = classic_sigma(eps, DELTA)
    tpr, fpr, mu = pivotal_rates(design, sigma)
    assert tpr == pytest.approx(special.ndtr(1 / (sigma * math.sqrt(2))), rel=1e-12)
    assert fpr == pytest.approx(1 - tpr, rel=1e-12)
    assert mu == pytest.approx(math.sqrt(2) / sigma, rel=1e-9)


@pytest.mark.parametrize("t", [2, 4, 8, 16])
def test_pivotal_design_even_t_tie_rules(t: int) -> None:
    m = t // 2
    a = pivotal_design(t, tie_rule="tie_without")
    assert (a.votes_with, a.votes_without) == ((m + 1, m - 1), (m, m))
    b = pivotal_design(t, tie_rule="tie_with")
    assert (b.votes_with, b.votes_without) == ((m, m), (m - 1, m + 1))
    for d in (a, b):
        assert d.gap_with - d.gap_without == 2
        assert sum(d.votes_with) == sum(d.votes_without) == t
        # replace-one: the others are the same in both worlds; the canary moves one vote
        assert d.other_labels.count(0) + 1 == d.votes_with[0]
        assert d.other_labels.count(1) == d.votes_without[1] - 1
        _, _, mu = pivotal_rates(d, 1.1)
        assert mu == pytest.approx(math.sqrt(2) / 1.1, rel=1e-9)


def test_pivotal_offsets_keep_mu_and_move_the_classical_ceiling() -> None:
    sigma = classic_sigma(8.0, DELTA)
    balanced = pivotal_design(5)
    tail = pivotal_design(5, gap=-1)  # C1 = [2, 3], C0 = [1, 4]
    assert pivotal_rates(tail, sigma)[2] == pytest.approx(math.sqrt(2) / sigma, rel=1e-9)
    eb = label_release_epsilon(balanced.votes_with, balanced.votes_without, sigma, DELTA)
    et = label_release_epsilon(tail.votes_with, tail.votes_without, sigma, DELTA)
    assert eb == pytest.approx(
        math.log(
            special.ndtr(1 / (sigma * math.sqrt(2))) / special.ndtr(-1 / (sigma * math.sqrt(2)))
        ),
        abs=1e-4,
    )
    assert et > eb


def test_pivotal_design_three_labels() -> None:
    d = pivotal_design(5, 3)
    assert d.votes_with == (3, 2, 0) and d.votes_without == (2, 3, 0)
    tpr, fpr, _ = pivotal_rates(d, 1.0)
    assert tpr == pytest.approx(_release_by_quadrature([3, 2, 0], 1.0, 0), abs=1e-7)
    assert fpr == pytest.approx(_release_by_quadrature([2, 3, 0], 1.0, 0), abs=1e-7)


def test_pivotal_rates_match_simulation() -> None:
    # Simulated noisy argmax at the configured sigma; each rate checked against a two-sided
    # 99.9% Clopper-Pearson interval: false-failure rate <= 0.2% (two checks), seed fixed.
    rng = np.random.default_rng(20261122)
    sigma, n = classic_sigma(4.0, DELTA), 20_000
    d = pivotal_design(9)
    tpr, fpr, _ = pivotal_rates(d, sigma)
    for votes, p in ((d.votes_with, tpr), (d.votes_without, fpr)):
        noisy = np.asarray(votes, dtype=float) + rng.normal(0, sigma, size=(n, 2))
        k = int(np.sum(noisy[:, 0] > noisy[:, 1]))
        ci = stats.binomtest(k, n).proportion_ci(0.999, method="exact")
        assert ci.low <= p <= ci.high


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((0,), {}), ((5, 1), {}), ((5,), {"gap": 2}), ((4,), {"gap": 7}), ((4,), {"tie_rule": "x"})],
)
def test_pivotal_design_rejects_bad_input(args: tuple[int, ...], kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidAuditInput):
        pivotal_design(*args, **kwargs)  # type: ignore[arg-type]
