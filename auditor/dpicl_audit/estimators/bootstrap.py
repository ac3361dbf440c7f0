"""Bootstrap auditing (paper 000, Algorithm 1), vectorised.

An internal auditor collects ``n_llm`` clean (pre-noise) outputs of the mechanism in each
world, the vote histograms (voting) or the clean partition-mean embeddings (ESA) that the
``internal`` debug endpoint returns, and then simulates ``n_sample`` noisy releases per world
by resampling those rows with replacement and adding the server's Gaussian noise. The attack
runs on the simulated releases; the estimators turn its counts into bounds.

Everything is array code: one ``integers`` draw for the resampled rows and one ``normal``
draw for the noise per chunk of trials (chunks keep memory bounded for wide histograms);
400,000 trials in each of the two worlds take about a tenth of a second.

ESA needs no ``d``-dimensional noise at all. The white-box score of a trial,
``||m - e_pos|| - ||m - e_neg||`` with ``m = c_i + z`` and ``z ~ N(0, sigma^2 I_d)``, depends
on ``z`` only through its projection on the plane spanned by ``c_i - e_pos`` and
``e_neg - e_pos`` and through ``||z||^2``. By rotation invariance the projection is a
2-dimensional ``N(0, sigma^2 I_2)`` and the rest of ``||z||^2`` an independent
``sigma^2 chi^2_{d-2}``. Drawing those three numbers per trial gives exactly the distribution of
the full simulation, at a cost independent of ``d`` (a test checks it against the direct
``d``-dimensional simulation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.counts import AuditEstimate, estimate_from_counts
from dpicl_audit.estimators.held_out import PositiveWhen
from dpicl_audit.estimators.stats import BoolArray, ConfidenceSplit, FloatArray
from dpicl_audit.estimators.thresholds import ThresholdEstimate, split_threshold_estimate

__all__ = [
    "BootstrapResult",
    "EsaSimulation",
    "VotingSimulation",
    "bootstrap_esa_audit",
    "bootstrap_voting_audit",
    "simulate_esa",
    "simulate_voting",
]

_CHUNK_ELEMENTS = 1 << 21  # noisy values held at once (16 MiB of float64)


@dataclass(frozen=True)
class VotingSimulation:
    """Simulated private-voting releases in both worlds (``n_sample`` trials each).

    ``decisions_*``: the black-box attack's call, "the noisy argmax (uniform random
    tie-breaking) is the positive label". ``scores_*``: the white-box score
    ``noisy[positive] - noisy[negative]`` (higher means "canary present").
    """

    decisions_with: BoolArray
    decisions_without: BoolArray
    scores_with: FloatArray
    scores_without: FloatArray


@dataclass(frozen=True)
class EsaSimulation:
    """Simulated ESA white-box scores ``||m - e_pos|| - ||m - e_neg||`` in both worlds.

    Lower means "canary present" (the noisy mean is nearer the positive option).
    """

    scores_with: FloatArray
    scores_without: FloatArray


@dataclass(frozen=True)
class BootstrapResult:
    """One bootstrap audit: black-box counts, white-box split estimate, and its cost.

    ``llm_calls`` counts the LLM calls behind the clean rows (rows times ``calls_per_row``);
    ``n_sample`` is the number of simulated trials per world.
    """

    mechanism: str
    sigma: float
    n_sample: int
    llm_calls: int
    black_box: AuditEstimate
    white_box: ThresholdEstimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "sigma": self.sigma,
            "n_sample": self.n_sample,
            "llm_calls": self.llm_calls,
            "black_box": self.black_box.to_dict(),
            "white_box": self.white_box.to_dict(),
        }


# --------------------------------------------------------------------------- validation


def _clean_rows(values: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise InvalidAuditInput(f"{name} must be a non-empty 2-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidAuditInput(f"{name} must be finite")
    return arr


def _sigma(sigma: float) -> float:
    s = float(sigma)
    if not (s >= 0.0 and np.isfinite(s)):
        raise InvalidAuditInput(f"sigma must be finite and non-negative, got {sigma!r}")
    return s


def _n_sample(n_sample: int) -> int:
    if isinstance(n_sample, bool) or not isinstance(n_sample, int | np.integer) or n_sample < 1:
        raise InvalidAuditInput(f"n_sample must be a positive whole number, got {n_sample!r}")
    return int(n_sample)


def _calls(n_rows: int, calls_per_row: int) -> int:
    if calls_per_row < 1:
        raise InvalidAuditInput(f"calls_per_row must be at least 1, got {calls_per_row}")
    return n_rows * calls_per_row


# --------------------------------------------------------------------------- voting


def _voting_world(
    clean: FloatArray,
    sigma: float,
    n_sample: int,
    pos: int,
    neg: int,
    rng: np.random.Generator,
) -> tuple[BoolArray, FloatArray]:
    n_llm, n_labels = clean.shape
    columns = np.ascontiguousarray(clean.T)  # (L, n_llm): label-major, so that the
    decisions = np.empty(n_sample, dtype=np.bool_)  # reductions over labels run on rows
    scores = np.empty(n_sample, dtype=np.float64)
    chunk = max(1, _CHUNK_ELEMENTS // n_labels)
    for start in range(0, n_sample, chunk):
        m = min(chunk, n_sample - start)
        noisy = np.take(columns, rng.integers(0, n_llm, size=m), axis=1)  # (L, m)
        noisy += sigma * rng.standard_normal((n_labels, m))
        top = noisy[pos].copy()
        scores[start : start + m] = top - noisy[neg]
        noisy[pos] = -np.inf
        other = noisy.max(axis=0)  # the best of the other labels
        chosen = top > other
        tied = np.flatnonzero(top == other)
        if tied.size:  # uniform among the tied maxima: the positive wins w.p. 1 / n_max
            n_max = 1 + np.count_nonzero(noisy[:, tied] == other[tied], axis=0)
            chosen[tied] = rng.random(tied.size) * n_max < 1.0
        decisions[start : start + m] = chosen
    return decisions, scores


def simulate_voting(
    clean_with: npt.ArrayLike,
    clean_without: npt.ArrayLike,
    sigma: float,
    n_sample: int,
    *,
    positive_index: int,
    negative_index: int,
    rng: np.random.Generator,
) -> VotingSimulation:
    """Algorithm 1, lines 5-9, for private voting: ``n_sample`` noisy histograms per world.

    ``clean_with``/``clean_without`` are ``(n_llm, L)`` clean vote histograms (counts per
    label) collected with and without the canary; each trial resamples one row with
    replacement and adds ``N(0, sigma^2)`` to every count. Returns the black-box decision
    (noisy argmax, ties broken uniformly at random, equals ``positive_index``) and the
    white-box score (``noisy[positive_index] - noisy[negative_index]``) of every trial. Only
    the observations are kept, never the ``n_sample x L`` histograms.
    """
    with_rows = _clean_rows(clean_with, "clean_with")
    without_rows = _clean_rows(clean_without, "clean_without")
    if with_rows.shape[1] != without_rows.shape[1]:
        raise InvalidAuditInput(
            f"clean_with and clean_without have {with_rows.shape[1]} and "
            f"{without_rows.shape[1]} labels"
        )
    n_labels = with_rows.shape[1]
    for name, index in (("positive_index", positive_index), ("negative_index", negative_index)):
        if not 0 <= index < n_labels:
            raise InvalidAuditInput(f"{name}={index} is outside the {n_labels} labels")
    if positive_index == negative_index:
        raise InvalidAuditInput("positive_index and negative_index must differ")
    s, n = _sigma(sigma), _n_sample(n_sample)
    dec_with, sc_with = _voting_world(with_rows, s, n, positive_index, negative_index, rng)
    dec_without, sc_without = _voting_world(without_rows, s, n, positive_index, negative_index, rng)
    return VotingSimulation(dec_with, dec_without, sc_with, sc_without)


def _estimate(
    mechanism: str,
    sigma: float,
    n_sample: int,
    calls: int,
    decisions: tuple[npt.ArrayLike, npt.ArrayLike],
    scores: tuple[FloatArray, FloatArray],
    positive_when: PositiveWhen,
    **kw: Any,
) -> BootstrapResult:
    """Both attacks on the simulated trials (with, without): the black-box decisions' counts
    and the held-out threshold on the scores; ``kw``: rng, fraction, confidence, delta, split."""
    tp, fp = (int(np.count_nonzero(d)) for d in decisions)
    black = estimate_from_counts(
        tp, n_sample - tp, fp, n_sample - fp, **{k: kw[k] for k in ("delta", "confidence", "split")}
    )
    white = split_threshold_estimate(*scores, positive_when=positive_when, **kw)
    return BootstrapResult(mechanism, float(sigma), int(n_sample), calls, black, white)


def bootstrap_voting_audit(
    clean_with: npt.ArrayLike,
    clean_without: npt.ArrayLike,
    sigma: float,
    n_sample: int,
    *,
    positive_index: int,
    negative_index: int,
    delta: float,
    confidence: float = 0.95,
    rng: np.random.Generator,
    fraction: float = 0.1,
    split: ConfidenceSplit = "bonferroni",
    calls_per_row: int = 1,
) -> BootstrapResult:
    """Algorithm 1 for private voting: simulate, attack, estimate.

    Black-box: :func:`~dpicl_audit.estimators.estimate_from_counts` on the argmax decisions.
    White-box: :func:`~dpicl_audit.estimators.split_threshold_estimate` on the vote-gap
    scores (threshold chosen on ``fraction`` of the trials, bound on the rest). ``fraction``
    defaults to 0.1, not 0.5: simulated trials are plentiful, the threshold needs few of them
    and the held-out part sets the width of the bound. On [1, 9] vs [0, 10] at epsilon 1 and
    400,000 trials per world the held-out epsilon bound averaged 0.956 of epsilon_exact with
    0.1 against 0.941 with 0.5. ``calls_per_row``: LLM calls behind one clean row (the
    partition count T for voting).
    """
    rows = np.shape(clean_with)[0] + np.shape(clean_without)[0]
    calls = _calls(int(rows), calls_per_row)
    sim = simulate_voting(
        clean_with,
        clean_without,
        sigma,
        n_sample,
        positive_index=positive_index,
        negative_index=negative_index,
        rng=rng,
    )
    decisions = (sim.decisions_with, sim.decisions_without)
    scores = (sim.scores_with, sim.scores_without)
    kw = dict(rng=rng, fraction=fraction, confidence=confidence, delta=delta, split=split)
    return _estimate("voting", sigma, n_sample, calls, decisions, scores, "above", **kw)


# --------------------------------------------------------------------------- ESA


def _esa_world(
    clean: FloatArray,
    sigma: float,
    n_sample: int,
    e_pos: FloatArray,
    e_neg: FloatArray,
    rng: np.random.Generator,
) -> FloatArray:
    d = clean.shape[1]
    b_vec = e_neg - e_pos
    b = float(np.linalg.norm(b_vec))
    if b == 0.0:  # the two options coincide: every score is 0
        return np.zeros(n_sample, dtype=np.float64)
    u1 = b_vec / b
    a = clean - e_pos  # (n_llm, d): c_i - e_pos
    alpha1 = a @ u1
    alpha2 = np.linalg.norm(a - np.outer(alpha1, u1), axis=1)  # >= 0: the in-plane second axis
    idx = rng.integers(0, clean.shape[0], size=n_sample)
    a1, a2 = alpha1[idx], alpha2[idx]
    w1 = sigma * rng.standard_normal(n_sample)
    if d >= 2:
        w2 = sigma * rng.standard_normal(n_sample)
        rest = sigma * sigma * rng.chisquare(d - 2, size=n_sample) if d > 2 else 0.0
    else:
        w2, rest = np.zeros(n_sample), 0.0
    x1 = a1 + w1  # coordinates of m - e_pos in the (u1, u2) plane
    x2 = a2 + w2
    side = x2 * x2 + rest
    dist_pos = np.sqrt(x1 * x1 + side)
    dist_neg = np.sqrt((x1 - b) * (x1 - b) + side)
    # ||m-e_pos||^2 - ||m-e_neg||^2 = 2 b x1 - b^2; divide by the sum: no cancellation.
    total = dist_pos + dist_neg
    with np.errstate(invalid="ignore", divide="ignore"):
        scores = np.where(total > 0.0, (2.0 * b * x1 - b * b) / total, 0.0)
    return np.asarray(scores, dtype=np.float64)


def simulate_esa(
    emb_with: npt.ArrayLike,
    emb_without: npt.ArrayLike,
    sigma: float,
    n_sample: int,
    *,
    e_pos: npt.ArrayLike,
    e_neg: npt.ArrayLike,
    rng: np.random.Generator,
) -> EsaSimulation:
    """Algorithm 1 for ESA: white-box scores of ``n_sample`` simulated releases per world.

    ``emb_with``/``emb_without`` are ``(n_llm, d)`` clean partition-mean embeddings (one row
    per clean mechanism run). Each trial resamples a row ``c`` and forms
    ``m = c + N(0, sigma^2 I_d)``; the score is ``||m - e_pos|| - ||m - e_neg||``. Sampled
    exactly through a 2-D projection plus a chi-square remainder (module docstring).
    """
    w = _clean_rows(emb_with, "emb_with")
    wo = _clean_rows(emb_without, "emb_without")
    pos = np.asarray(e_pos, dtype=np.float64)
    neg = np.asarray(e_neg, dtype=np.float64)
    d = w.shape[1]
    if wo.shape[1] != d or pos.shape != (d,) or neg.shape != (d,):
        raise InvalidAuditInput(
            f"dimensions differ: emb_with {w.shape}, emb_without {wo.shape}, "
            f"e_pos {pos.shape}, e_neg {neg.shape}"
        )
    if not (np.all(np.isfinite(pos)) and np.all(np.isfinite(neg))):
        raise InvalidAuditInput("e_pos and e_neg must be finite")
    s, n = _sigma(sigma), _n_sample(n_sample)
    return EsaSimulation(_esa_world(w, s, n, pos, neg, rng), _esa_world(wo, s, n, pos, neg, rng))


def bootstrap_esa_audit(
    emb_with: npt.ArrayLike,
    emb_without: npt.ArrayLike,
    sigma: float,
    n_sample: int,
    *,
    e_pos: npt.ArrayLike,
    e_neg: npt.ArrayLike,
    delta: float,
    confidence: float = 0.95,
    rng: np.random.Generator,
    fraction: float = 0.1,
    split: ConfidenceSplit = "bonferroni",
    calls_per_row: int = 1,
) -> BootstrapResult:
    """Algorithm 1 for ESA: simulate, attack, estimate.

    White-box: "canary present" when the score is below a threshold (chosen on ``fraction``
    of the trials, bound on the rest). Black-box: the released option is the one nearer the
    noisy mean (score < 0), i.e. the zero-shot candidate pool is assumed to contain both audit
    options; with a pool holding only one of them the real black-box attack is weaker.
    ``fraction`` defaults to 0.1 as for voting; ``calls_per_row``: LLM calls behind one clean
    mean (T partitions, plus the zero-shot candidates if they were generated per row).
    """
    rows = np.shape(emb_with)[0] + np.shape(emb_without)[0]
    calls = _calls(int(rows), calls_per_row)
    sim = simulate_esa(emb_with, emb_without, sigma, n_sample, e_pos=e_pos, e_neg=e_neg, rng=rng)
    decisions = (sim.scores_with < 0.0, sim.scores_without < 0.0)  # released: nearer e_pos
    scores = (sim.scores_with, sim.scores_without)
    kw = dict(rng=rng, fraction=fraction, confidence=confidence, delta=delta, split=split)
    return _estimate("esa", sigma, n_sample, calls, decisions, scores, "below", **kw)
