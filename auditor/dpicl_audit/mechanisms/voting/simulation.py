"""Algorithm 1 of paper 000 for private voting, vectorised: noisy histograms simulated from
the clean ones collected in each world (:mod:`.bootstrap` reads them from the trial log).

Everything is array code: one ``integers`` draw for the resampled rows and one ``normal``
draw for the noise per chunk of trials (chunks keep memory bounded for wide histograms);
400,000 trials in each of the two worlds take about a tenth of a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.bootstrap import (
    CHUNK_ELEMENTS,
    BootstrapResult,
    calls_for,
    check_n_sample,
    check_sigma,
    clean_rows,
    estimate_simulated,
)
from dpicl_audit.estimators.stats import BoolArray, ConfidenceSplit, FloatArray

__all__ = ["VotingSimulation", "bootstrap_voting_audit", "simulate_voting"]


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
    chunk = max(1, CHUNK_ELEMENTS // n_labels)
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
    with_rows = clean_rows(clean_with, "clean_with")
    without_rows = clean_rows(clean_without, "clean_without")
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
    s, n = check_sigma(sigma), check_n_sample(n_sample)
    dec_with, sc_with = _voting_world(with_rows, s, n, positive_index, negative_index, rng)
    dec_without, sc_without = _voting_world(without_rows, s, n, positive_index, negative_index, rng)
    return VotingSimulation(dec_with, dec_without, sc_with, sc_without)


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
    calls = calls_for(int(rows), calls_per_row)
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
    return estimate_simulated("voting", sigma, n_sample, calls, decisions, scores, "above", **kw)
