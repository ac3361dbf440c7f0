r"""Private voting: paper 000, Algorithm 2 (Wu et al.'s DP-ICL for classification).

Lines 3-6: each of the T partitions votes for one label
(:func:`dpicl.pipelines.votes.partition_votes`, the kit's step) and the
votes are counted into a clean histogram V (:func:`vote_histogram`). Lines 7-10: Gaussian
noise N(0, sigma^2) is added to every count and the label with the highest noisy count is
released (:func:`noisy_argmax`). :func:`private_vote` is the whole of it.

A neighbouring context changes one partition, so one vote moves from one label to another:
V changes by -1 and +1 in two coordinates, an L2 change of sqrt(2) (see
:data:`VOTING_SENSITIVITY`). The noisy histogram is then the
Gaussian mechanism and its argmax post-processing of it.

A partition whose scores are unusable (a NaN or +inf, or no finite score: a model whose
numerics failed on that partition's prompt) abstains
(:data:`~dpicl.pipelines.votes.ABSTAIN`) and adds to no count. Its vote is still a function
of that partition alone, and moving one vote between a label and no label changes V by 1 in
one coordinate, so the sensitivity stays sqrt(2).
Failing the whole query instead would release a bit computed from the private prompts,
outside the noise: whether some partition's numerics failed.

Ties are broken uniformly at random, never by index: a fixed rule (say, the lowest index)
would make the released label a deterministic function of exactly-tied scores, which is
both biased and a side channel on the clean votes.

:func:`noisy_argmax_probabilities` gives the exact distribution of the released label, for
the statistical tests and the auditor's reference values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import integrate
from scipy.special import log_ndtr

from dpicl.pipelines.votes import ABSTAIN, argmax_uniform_ties, partition_votes

__all__ = [
    "VOTING_SENSITIVITY",
    "VotingRelease",
    "noisy_argmax",
    "noisy_argmax_probabilities",
    "private_vote",
    "vote_histogram",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

#: L2 sensitivity of the vote histogram. A neighbour changes one partition, whose vote moves
#: from one label to another: one count drops by 1 and another rises by 1, so the histogram
#: moves by sqrt(1^2 + 1^2) = sqrt(2). With the classic formula this gives
#: sigma = 2 sqrt(ln(1.25/delta)) / epsilon, exactly paper 000, Algorithm 2 line 7.
VOTING_SENSITIVITY = math.sqrt(2.0)


def vote_histogram(votes: IntArray, n_labels: int) -> FloatArray:
    """The clean vote vector V: V[l] = number of partitions that voted for label l
    (Algorithm 2, lines 2-6); :data:`ABSTAIN` votes count for none."""
    v = np.asarray(votes)
    if v.ndim != 1 or (v.size and not np.issubdtype(v.dtype, np.integer)):
        raise ValueError(f"votes must be a 1-D integer array, got {v.dtype} {v.shape}")
    if n_labels < 1:
        raise ValueError(f"n_labels must be >= 1, got {n_labels}")
    if v.size and (v.min() < ABSTAIN or v.max() >= n_labels):
        raise ValueError(
            f"votes must lie in [0, {n_labels}) or be {ABSTAIN} (abstain), got "
            f"[{v.min()}, {v.max()}]"
        )
    counted = v[v != ABSTAIN].astype(np.int64)
    return np.bincount(counted, minlength=n_labels).astype(np.float64)


def _check_counts(counts: FloatArray) -> FloatArray:
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"counts must be a non-empty 1-D array, got shape {c.shape}")
    if not np.isfinite(c).all():
        raise ValueError("counts must be finite")
    return c


def _check_sigma(sigma: float) -> float:
    s = float(sigma)
    if not math.isfinite(s) or s < 0.0:
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    return s


def noisy_argmax(
    counts: FloatArray, sigma: float, rng: np.random.Generator
) -> tuple[int, FloatArray]:
    """Add N(0, sigma^2) to every count and return (argmax, noisy counts) (Algorithm 2,
    lines 8-9). Ties (possible only with sigma = 0, which tests and positive controls use)
    are broken uniformly at random."""
    c = _check_counts(counts)
    s = _check_sigma(sigma)
    noisy = c + rng.normal(0.0, s, size=c.shape)
    return int(argmax_uniform_ties(noisy[np.newaxis, :], rng)[0]), noisy


@dataclass(frozen=True, eq=False)
class VotingRelease:
    """One answer of the mechanism. Only ``label_index`` is public; ``noisy_counts`` goes to
    the white-box debug endpoint at ``noisy``, the clean values only at ``internal``.
    The arrays are read-only."""

    label_index: int
    noisy_counts: FloatArray
    clean_counts: FloatArray
    partition_votes: IntArray


def _frozen(a: npt.NDArray[np.generic]) -> None:
    a.setflags(write=False)


def private_vote(
    scores: FloatArray, sigma: float, temperature: float, rng: np.random.Generator
) -> VotingRelease:
    """Algorithm 2 of paper 000 from the (T, L) label scores: per-partition votes, clean
    histogram, Gaussian noise of scale ``sigma`` on every count, noisy argmax."""
    s = np.asarray(scores, dtype=np.float64)
    votes = partition_votes(s, temperature, rng)
    clean = vote_histogram(votes, s.shape[1])
    index, noisy = noisy_argmax(clean, sigma, rng)
    for a in (votes, clean, noisy):
        _frozen(a)
    return VotingRelease(
        label_index=index, noisy_counts=noisy, clean_counts=clean, partition_votes=votes
    )


def _log_integrand(x: FloatArray, gaps: FloatArray) -> FloatArray:
    # log[ phi(x) * prod_j Phi(x + gap_j) ], summed in logs so that no factor underflows.
    lp = -0.5 * x * x - _LOG_SQRT_2PI
    if gaps.size:
        lp = lp + log_ndtr(x[:, np.newaxis] + gaps[np.newaxis, :]).sum(axis=1)
    return np.asarray(lp, dtype=np.float64)


def noisy_argmax_probabilities(counts: FloatArray, sigma: float) -> FloatArray:
    r"""The exact distribution of :func:`noisy_argmax`'s index, by numerical integration.

    Label i wins when c_i + sigma Z_i > c_j + sigma Z_j for every j != i, with Z iid
    standard normal. Conditioning on Z_i = x, the other events are independent:

    .. math::

        P(i) = \int \phi(x) \prod_{j \ne i} \Phi\!\left(x + \frac{c_i - c_j}{\sigma}\right) dx.

    The integrand is at most phi(x), so [-40, 40] holds all but 1e-300 of its mass; the
    integral is taken by adaptive quadrature (scipy.integrate.quad) with a breakpoint at the
    integrand's peak. sigma = 0 gives the uniform distribution over the maximal counts.
    The probabilities are not renormalised (the tests check that they sum to 1).
    """
    c = _check_counts(counts)
    s = _check_sigma(sigma)
    n = c.size
    if s == 0.0:
        top = (c == c.max()).astype(np.float64)
        return np.asarray(top / top.sum(), dtype=np.float64)
    if n == 1:
        return np.ones(1, dtype=np.float64)
    lo, hi = -40.0, 40.0
    grid = np.linspace(lo, hi, 8001)
    out = np.empty(n, dtype=np.float64)
    for i in range(n):
        gaps = (c[i] - np.delete(c, i)) / s
        peak = float(grid[np.argmax(_log_integrand(grid, gaps))])

        def f(x: float, gaps: FloatArray = gaps) -> float:
            return math.exp(float(_log_integrand(np.array([x]), gaps)[0]))

        points = [peak] if lo < peak < hi else None
        value, _err = integrate.quad(
            f, lo, hi, points=points, epsabs=1e-14, epsrel=1e-11, limit=500
        )
        out[i] = min(max(value, 0.0), 1.0)
    return out
