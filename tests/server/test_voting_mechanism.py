"""Private voting (dpicl.mechanisms.voting.release; paper 000, Algorithm 2).

Statistical tests use fixed seeds, so they are deterministic; each states the probability
with which it would fail for a correct implementation under a fresh seed (its false-failure
rate), always <= 1e-4.
"""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
from scipy.stats import chi2, chisquare, multivariate_normal, norm

from dpicl.errors import ConfigurationError
from dpicl.mechanisms.voting.release import (
    VotingRelease,
    noisy_argmax,
    noisy_argmax_probabilities,
    private_vote,
    vote_histogram,
)
from dpicl.pipelines.votes import ABSTAIN, partition_votes

ALPHA = 1e-4  # false-failure rate of every statistical test below


def one_hot_scores(votes: list[int], n_labels: int) -> np.ndarray:
    """(T, L) log-likelihoods under which partition t clearly prefers label votes[t]."""
    s = np.full((len(votes), n_labels), -30.0)
    s[np.arange(len(votes)), votes] = 0.0
    return s


def test_partition_votes_argmax_at_temperature_zero() -> None:
    rng = np.random.default_rng(1)
    scores = np.array([[-1.0, -0.2, -3.0], [-0.1, -2.0, -np.inf], [-5.0, -4.0, -0.5]])
    assert partition_votes(scores, 0.0, rng).tolist() == [1, 0, 2]
    assert partition_votes(np.zeros((0, 3)), 0.0, rng).shape == (0,)


def test_partition_votes_ties_are_uniform_not_by_index() -> None:
    # 30,000 partitions, every one tied between all 3 labels: chi-square test of uniformity.
    # False-failure rate 1e-4 (the p-value threshold).
    rng = np.random.default_rng(20240601)
    votes = partition_votes(np.zeros((30_000, 3)), 0.0, rng)
    counts = np.bincount(votes, minlength=3)
    assert chisquare(counts).pvalue > ALPHA
    # Partial ties: labels 0, 1 and 3 tied at the top, 2 strictly below: 2 never wins and
    # the others share uniformly. False-failure rate 1e-4.
    votes = partition_votes(np.tile([1.0, 1.0, 0.0, 1.0], (30_000, 1)), 0.0, rng)
    counts = np.bincount(votes, minlength=4)
    assert counts[2] == 0
    assert chisquare(counts[[0, 1, 3]]).pvalue > ALPHA


def test_partition_votes_samples_the_softmax() -> None:
    # 40,000 partitions with the same scores at temperature 0.7: chi-square against
    # softmax(scores / 0.7). False-failure rate 1e-4.
    rng = np.random.default_rng(7)
    row = np.array([0.0, -1.0, -2.0, -np.inf])
    votes = partition_votes(np.tile(row, (40_000, 1)), 0.7, rng)
    counts = np.bincount(votes, minlength=4)
    assert counts[3] == 0  # a -inf score is never sampled
    p = np.exp(row[:3] / 0.7)
    p /= p.sum()
    assert chisquare(counts[:3], 40_000 * p).pvalue > ALPHA


def test_partition_votes_tiny_temperature_is_the_argmax() -> None:
    rng = np.random.default_rng(3)
    scores = np.array([[0.0, -1e-3, -5.0]] * 100)
    assert (partition_votes(scores, 1e-300, rng) == 0).all()


@pytest.mark.parametrize("temperature", [-0.1, math.nan, math.inf])
def test_partition_votes_rejects_bad_temperature(temperature: float) -> None:
    with pytest.raises(ConfigurationError) as info:
        partition_votes(np.zeros((2, 2)), temperature, np.random.default_rng(0))
    assert info.value.param == "mechanism.temperature"
    assert str(temperature) in info.value.message


def test_partition_votes_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="shape"):
        partition_votes(np.zeros(3), 0.0, np.random.default_rng(0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_unusable_partitions_abstain(temperature: float) -> None:
    """A row with a NaN or +inf, or with no finite score, votes ABSTAIN; usable rows vote."""
    s = np.array(
        [
            [0.0, -1.0],  # usable: label 0 at temperature 0
            [0.0, np.nan],
            [-np.inf, -np.inf],
            [np.inf, 0.0],
            [-3.0, -np.inf],  # usable: -inf is an impossible label, not a failure
        ]
    )
    votes = partition_votes(s, temperature, np.random.default_rng(0))
    assert votes[1:4].tolist() == [ABSTAIN] * 3
    assert votes[4] == 0
    if temperature == 0.0:
        assert votes[0] == 0
    assert (
        partition_votes(np.full((3, 2), np.nan), temperature, np.random.default_rng(0)) == ABSTAIN
    ).all()


def test_an_abstaining_partition_keeps_the_sensitivity() -> None:
    """Neighbours differ in one partition: whether it votes for a label or abstains, the
    clean histograms differ by at most sqrt(2) in L2 (the sensitivity sigma is set for)."""
    rng = np.random.default_rng(1)
    base = np.array([[0.0, -1.0, -2.0], [-1.0, 0.0, -2.0], [-2.0, -1.0, 0.0]])
    rows = [np.array([0.0, -5.0, -5.0]), np.array([-5.0, 0.0, -5.0]), np.array([np.nan, 0, 0])]
    hists = []
    for row in rows:
        s = np.vstack([base, row])
        hists.append(vote_histogram(partition_votes(s, 0.0, rng), 3))
    assert hists[2].sum() == 3  # the NaN partition counted for no label
    for a in hists:
        for b in hists:
            assert np.linalg.norm(a - b) <= np.sqrt(2) + 1e-12


def test_vote_histogram() -> None:
    h = vote_histogram(np.array([0, 2, 2, 1, 2], dtype=np.int64), 4)
    assert h.dtype == np.float64
    assert h.tolist() == [1.0, 1.0, 3.0, 0.0]
    assert vote_histogram(np.zeros(0, dtype=np.int64), 2).tolist() == [0.0, 0.0]
    assert vote_histogram(np.array([ABSTAIN, 1, ABSTAIN]), 2).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="abstain"):
        vote_histogram(np.array([-2, 1]), 2)
    with pytest.raises(ValueError, match="votes"):
        vote_histogram(np.array([0, 4]), 4)


def test_noisy_argmax_ties_at_sigma_zero_are_uniform() -> None:
    # sigma = 0 leaves the tie between labels 1, 2 and 4 to the tie-breaker: over 6,000
    # calls each should win a third of the time (chi-square, false-failure rate 1e-4).
    rng = np.random.default_rng(11)
    counts = np.array([2.0, 5.0, 5.0, 1.0, 5.0])
    wins = np.zeros(5, dtype=np.int64)
    for _ in range(6_000):
        index, noisy = noisy_argmax(counts, 0.0, rng)
        wins[index] += 1
    assert np.array_equal(noisy, counts)
    assert wins[0] == wins[3] == 0
    assert chisquare(wins[[1, 2, 4]]).pvalue > ALPHA


@pytest.mark.parametrize(
    ("c0", "c1", "sigma"), [(4.0, 2.0, 1.3), (0.0, 0.0, 2.0), (1.0, 9.0, 4.8), (5.0, 4.0, 0.1)]
)
def test_probabilities_two_labels_closed_form(c0: float, c1: float, sigma: float) -> None:
    # Label 0 wins iff N1 - N0 < c0 - c1 with N1 - N0 ~ N(0, 2 sigma^2).
    p = noisy_argmax_probabilities(np.array([c0, c1]), sigma)
    expected = norm.cdf((c0 - c1) / (sigma * math.sqrt(2)))
    assert p[0] == pytest.approx(expected, abs=1e-10)
    assert p[1] == pytest.approx(1 - expected, abs=1e-10)


def test_probabilities_three_labels_against_multivariate_normal_cdf() -> None:
    # Independent reference: label i wins iff (N_j - N_i)_{j != i} < (c_i - c_j)_{j != i};
    # that vector is N(0, sigma^2 (I + 11^T)), whose CDF scipy evaluates (Genz's method).
    counts = np.array([3.0, 5.0, 2.0])
    sigma = 1.7
    p = noisy_argmax_probabilities(counts, sigma)
    cov = sigma**2 * (np.eye(2) + np.ones((2, 2)))
    for i in range(3):
        upper = counts[i] - np.delete(counts, i)
        ref = multivariate_normal.cdf(
            upper, mean=np.zeros(2), cov=cov, abseps=1e-9, releps=1e-9, rng=np.random.default_rng(0)
        )
        assert p[i] == pytest.approx(ref, abs=1e-6)


def test_probabilities_are_a_distribution_with_the_symmetries() -> None:
    rng = np.random.default_rng(5)
    for _ in range(5):
        counts = rng.integers(0, 12, size=int(rng.integers(2, 8))).astype(np.float64)
        sigma = float(rng.uniform(0.3, 6.0))
        p = noisy_argmax_probabilities(counts, sigma)
        assert p.sum() == pytest.approx(1.0, abs=1e-8)
        perm = rng.permutation(counts.size)
        assert np.allclose(noisy_argmax_probabilities(counts[perm], sigma), p[perm], atol=1e-10)
    assert np.allclose(noisy_argmax_probabilities(np.full(4, 3.0), 2.0), 0.25, atol=1e-10)
    assert noisy_argmax_probabilities(np.array([1.0, 3.0, 3.0]), 0.0).tolist() == [0, 0.5, 0.5]
    assert noisy_argmax_probabilities(np.array([7.0]), 1.0).tolist() == [1.0]


@pytest.mark.parametrize(
    ("votes", "n_labels", "sigma", "seed"),
    [
        ([0, 1, 1, 2, 1, 0, 1, 2, 0, 1], 3, 1.5, 101),  # clean counts [3, 5, 2]
        ([0, 0, 1, 2, 3, 3, 3, 1], 4, 3.0, 202),  # clean counts [2, 2, 1, 3]
    ],
)
def test_released_label_follows_the_exact_distribution(
    votes: list[int], n_labels: int, sigma: float, seed: int
) -> None:
    # 10,000 independent runs of the whole mechanism; chi-square goodness of fit of the
    # released labels against the quadrature probabilities. False-failure rate 1e-4.
    rng = np.random.default_rng(seed)
    scores = one_hot_scores(votes, n_labels)
    clean = vote_histogram(np.array(votes, dtype=np.int64), n_labels)
    trials = 10_000
    released = np.zeros(n_labels, dtype=np.int64)
    for _ in range(trials):
        release = private_vote(scores, sigma, 0.0, rng)
        released[release.label_index] += 1
    assert np.array_equal(release.clean_counts, clean)
    expected = trials * noisy_argmax_probabilities(clean, sigma)
    assert expected.min() > 5  # the chi-square approximation holds
    assert chisquare(released, expected).pvalue > ALPHA


def test_noise_has_standard_deviation_sigma() -> None:
    # noisy - clean over 5,000 releases x 20 labels = 100,000 draws that should be iid
    # N(0, sigma^2). Variance: (n-1) s^2 / sigma^2 ~ chi2(n-1), two-sided interval at total
    # rate 5e-5; mean: z-test, two-sided at 5e-5. False-failure rate 1e-4 in all.
    sigma = 2.0 * math.sqrt(math.log(1.25 / 1e-5)) / 1.0  # Algorithm 2's sigma at (1, 1e-5)
    rng = np.random.default_rng(424242)
    scores = one_hot_scores([0, 1, 1, 3, 4, 4, 4, 2, 19, 7], 20)
    residuals = []
    for _ in range(5_000):
        release = private_vote(scores, sigma, 0.0, rng)
        residuals.append(release.noisy_counts - release.clean_counts)
    r = np.concatenate(residuals)
    n = r.size
    stat = (n - 1) * r.var(ddof=1) / sigma**2
    assert chi2.ppf(2.5e-5, n - 1) < stat < chi2.ppf(1 - 2.5e-5, n - 1)
    assert abs(r.mean()) / (sigma / math.sqrt(n)) < norm.ppf(1 - 2.5e-5)


def test_private_vote_release_fields_and_determinism() -> None:
    scores = one_hot_scores([0, 1, 1], 2)
    a = private_vote(scores, 1.0, 0.0, np.random.default_rng(9))
    b = private_vote(scores, 1.0, 0.0, np.random.default_rng(9))
    assert isinstance(a, VotingRelease)
    assert a.label_index == b.label_index
    assert np.array_equal(a.noisy_counts, b.noisy_counts)
    assert a.partition_votes.tolist() == [0, 1, 1]
    assert a.clean_counts.tolist() == [1.0, 2.0]
    assert a.label_index == int(np.argmax(a.noisy_counts))
    with pytest.raises(FrozenInstanceError):
        a.label_index = 0  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        a.noisy_counts[0] = 100.0


def test_noisy_argmax_rejects_bad_sigma() -> None:
    with pytest.raises(ValueError, match="sigma"):
        noisy_argmax(np.array([1.0, 2.0]), -1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="sigma"):
        noisy_argmax_probabilities(np.array([1.0, 2.0]), math.nan)
