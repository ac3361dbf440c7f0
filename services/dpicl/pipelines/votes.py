"""A partition's vote from its label scores: the step of private voting (paper 000,
Algorithm 2, lines 3-6) that every voting variant and the zero-shot baseline share. Below
the mechanisms: it knows no noise and no mechanism (:mod:`dpicl.mechanisms.voting.release`
explains why an unusable partition abstains and why ties are broken at random)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from dpicl.errors import ConfigurationError

__all__ = [
    "ABSTAIN",
    "CONTENT_FREE",
    "argmax_uniform_ties",
    "content_free_calibrated",
    "exemplar_bias",
    "exemplar_calibrated",
    "partition_votes",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: The vote of a partition whose label scores are unusable: it counts for no label.
ABSTAIN = -1


def argmax_uniform_ties(values: FloatArray, rng: np.random.Generator) -> IntArray:
    """Row-wise argmax of a 2-D array; among exactly tied maxima, one uniformly at random.

    Every entry gets an independent U[0, 1) key and the maxima's largest key wins: by
    symmetry each tied maximum wins with probability 1/(number of ties). (Two equal keys
    have probability about 2^-53 per pair; that residual index bias is immaterial.)"""
    best = values.max(axis=1, keepdims=True)
    keys = rng.random(values.shape)
    keys[values != best] = -1.0
    return np.asarray(keys.argmax(axis=1), dtype=np.int64)


def partition_votes(scores: FloatArray, temperature: float, rng: np.random.Generator) -> IntArray:
    """Each partition's vote from its (T, L) label scores (log-likelihoods).

    Temperature 0: the argmax, ties broken uniformly at random. Temperature tau > 0: a
    sample from softmax(scores / tau), drawn exactly with the Gumbel-max trick
    (argmax of scores/tau + Gumbel(0, 1) noise). Scores may be -inf (impossible label). A
    row with a NaN or +inf, or without a finite score, votes :data:`ABSTAIN` (see the
    module docstring for why it is not an error). This randomness only selects the clean
    votes; the privacy guarantee does not depend on it.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] == 0:
        raise ValueError(f"scores must be a (T, L) array with L >= 1, got shape {s.shape}")
    t = float(temperature)
    if not math.isfinite(t) or t < 0.0:
        raise ConfigurationError(
            f"temperature must be a finite number >= 0, got {temperature!r}",
            param="mechanism.temperature",
        )
    if s.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    # (s < inf) is false for NaN too; a usable row also has a finite maximum.
    usable = (s < np.inf).all(axis=1) & np.isfinite(s).any(axis=1)
    votes = np.full(s.shape[0], ABSTAIN, dtype=np.int64)
    u = s[usable]
    if u.shape[0] == 0:
        return votes
    if t == 0.0:
        votes[usable] = argmax_uniform_ties(u, rng)
        return votes
    # Shift by the row maximum first: (s - max)/tau <= 0 cannot overflow to +inf, even for
    # tiny tau (the maxima stay at exactly 0, so the tau -> 0 limit is the argmax).
    shifted = (u - u.max(axis=1, keepdims=True)) / t
    votes[usable] = argmax_uniform_ties(shifted + rng.gumbel(size=u.shape), rng)
    return votes


#: The content-free input of contextual calibration (Zhao et al. 2021, Section 5).
CONTENT_FREE = "N/A"


def _log_softmax(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Row-wise log-softmax; a row with a non-finite score stays non-finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x, axis=1, keepdims=True)
        out = x - m - np.log(np.sum(np.exp(x - m), axis=1, keepdims=True))
        return np.asarray(out, dtype=np.float64)


def content_free_calibrated(
    scores: npt.NDArray[np.float64], free: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Row by row: log-softmax of ``scores`` minus log-softmax of ``free`` (the content-free
    input's scores under the same exemplars). A row with a non-finite score stays
    non-finite, so that its partition abstains as it would uncalibrated."""
    with np.errstate(invalid="ignore"):
        return _log_softmax(scores) - _log_softmax(free)


def exemplar_bias(reference: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """One partition's label bias (1, L) from its own exemplar inputs' scores (k, L), each
    scored as a query under that partition's prompt: the mean of their log-softmax rows.

    Batch calibration (Zhou et al. 2024, "Batch Calibration", Section 4) estimates the
    contextual bias as the mean label distribution of a batch of inputs under the prompt; the
    batch here is the partition's exemplars, so the bias is a function of that partition
    alone. The mean is taken in log space (the geometric mean of the distributions, as
    bench/utility_calibration.py measured it); :func:`exemplar_calibrated` subtracts it. No
    exemplar (k = 0): a zero bias, i.e. the scores stay uncalibrated. An
    unusable exemplar row makes the bias non-finite, and the partition abstains."""
    r = np.asarray(reference, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"reference must be a (k, L) array, got shape {r.shape}")
    if r.shape[0] == 0:
        return np.zeros((1, r.shape[1]), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.asarray(_log_softmax(r).mean(axis=0, keepdims=True), dtype=np.float64)


def exemplar_calibrated(
    scores: npt.NDArray[np.float64], bias: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Row by row: log-softmax of the query's ``scores`` (T, L) minus partition t's
    :func:`exemplar_bias` (row t of ``bias``): the label probabilities divided by the
    partition's mean exemplar distribution (Zhou et al. 2024). A non-finite row (score or
    bias) stays non-finite, so that its partition abstains."""
    with np.errstate(invalid="ignore"):
        return np.asarray(_log_softmax(scores) - bias, dtype=np.float64)
