"""Private voting's bootstrap (paper 000, Algorithm 1), read top-down: the clean vote vectors
read from the trial log (after the noise check, :mod:`dpicl_audit.estimators.noise_check`), the
audit of the simulated releases (:func:`bootstrap_voting_audit`), and the simulation itself
(:func:`simulate_voting`), vectorised.

The simulation is array code: one ``integers`` draw for the resampled rows and one ``normal``
draw for the noise per chunk of trials (chunks keep memory bounded for wide histograms);
400,000 trials in each of the two worlds take about a tenth of a second. The estimators
(:func:`~dpicl_audit.estimators.bootstrap.estimate_simulated`) take its decisions and scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy import special

from dpicl_audit.catalog.settings import PartitionedSettings
from dpicl_audit.claims import SettingClaims
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
from dpicl_audit.estimators.noise_check import check_noise, residuals_from_observations
from dpicl_audit.estimators.power import flip_rate_from_signals
from dpicl_audit.estimators.stats import BoolArray, ConfidenceSplit, FloatArray
from dpicl_audit.mechanisms.trial_estimates import with_verdict
from dpicl_audit.mechanisms.voting.design import AuditDesign
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import STREAM_BOOTSTRAP
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.store import TrialRecord

__all__ = [
    "VotingSimulation",
    "bootstrap_voting_audit",
    "estimate_voting_bootstrap",
    "simulate_voting",
]


def estimate_voting_bootstrap(
    plan: AuditPlan,
    design: AuditDesign,
    k: int,
    clean: Sequence[TrialRecord],
    claims: SettingClaims,
) -> SettingResult:
    """One setting's bootstrap: its clean votes (``clean``, the debug rows of the clean log)
    resampled with noise of the sigma the noise check trusts, and both figures' verdicts."""
    out = SettingResult.of(**claims.to_json())  # the setting's claims, then the bootstrap's
    with_rows = [design.clean_vector(r.observation["clean_votes"]) for r in clean if r.world == 1]
    without_rows = [
        design.clean_vector(r.observation["clean_votes"]) for r in clean if r.world == 0
    ]
    pos = design.labels.index(design.positive)
    if design.negative is not None:
        neg = design.labels.index(design.negative)
    else:  # Brainwash: the strongest competitor in the clean votes
        totals = np.sum(np.array(with_rows + without_rows, dtype=np.float64), axis=0)
        totals[pos] = -np.inf
        neg = int(np.argmax(totals))
    n_sample = plan.bootstrap.n_sample
    ids = claims.context_id_set()
    sigma_sim = claims.sigma
    if claims.sigma is not None:
        # The simulation trusts the reported sigma only if the real noise agrees with it.
        check = check_noise(
            residuals_from_observations(
                (r.observation for r in clean if r.context_id in ids), design.labels
            ),
            claims.sigma,
        )
        out = out.updated(noise_check=check.to_dict())
        sigma_sim = check.simulation_sigma
    out = out.updated(
        sigma_simulated=sigma_sim,
        n_llm=len(with_rows),
        n_sample=n_sample,
        trials=2 * n_sample,
        llm_calls=len(clean) * PartitionedSettings.of(plan).partitions,
        positive=design.positive,
        negative=design.labels[neg],
    )
    if not with_rows or not without_rows or sigma_sim is None:  # None: no sigma reported
        failed = Estimate.of(error="no clean votes collected")
        return out.updated(black_box=failed, white_box=failed)
    res = bootstrap_voting_audit(
        np.array(with_rows),
        np.array(without_rows),
        sigma_sim,
        n_sample,
        positive_index=pos,
        negative_index=neg,
        delta=plan.mechanism.delta,
        confidence=plan.confidence,
        rng=np.random.default_rng([plan.seed, STREAM_BOOTSTRAP, k]),
        fraction=plan.split,
        calls_per_row=PartitionedSettings.of(plan).partitions,
    ).to_dict()
    flips, rates = _observed_signal(
        np.array(with_rows), np.array(without_rows), pos, neg, sigma_sim
    )
    power = replace(claims, flip_rate=flips, release_rates=rates)
    return out.updated(
        flip_rate=flips,
        release_rates_observed=list(rates),
        black_box=with_verdict(Estimate.of(**res["black_box"]), power),
        white_box=with_verdict(Estimate.of(**res["white_box"]), power),
    )


def _observed_signal(
    with_rows: np.ndarray, without_rows: np.ndarray, pos: int, neg: int, sigma: float
) -> tuple[float, tuple[float, float]]:
    """What the clean votes say about the audit's power: the fraction of (row-aligned) pairs
    whose clean votes differ between worlds, and the black-box rule's release rates averaged
    over the collected votes (two-label closed form on the positive/negative counts)."""
    n = min(len(with_rows), len(without_rows))
    flips = flip_rate_from_signals(with_rows[:n], without_rows[:n])
    scale = sigma * np.sqrt(2.0)
    p1, p0 = (
        float(np.mean(special.ndtr((rows[:, pos] - rows[:, neg]) / scale)))
        for rows in (with_rows, without_rows)
    )
    return flips, (p1, p0)


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
    pos, neg = positive_index, negative_index
    decisions = np.empty((2, n), dtype=np.bool_)  # row 0: with the canary, row 1: without
    scores = np.empty((2, n), dtype=np.float64)
    chunk = max(1, CHUNK_ELEMENTS // n_labels)
    for world, clean in enumerate((with_rows, without_rows)):
        n_llm = clean.shape[0]
        # (L, n_llm): label-major, so that the reductions over labels run on rows
        columns = np.ascontiguousarray(clean.T)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            noisy = np.take(columns, rng.integers(0, n_llm, size=m), axis=1)  # (L, m)
            noisy += s * rng.standard_normal((n_labels, m))
            top = noisy[pos].copy()
            scores[world, start : start + m] = top - noisy[neg]
            noisy[pos] = -np.inf
            other = noisy.max(axis=0)  # the best of the other labels
            chosen = top > other
            tied = np.flatnonzero(top == other)
            if tied.size:  # uniform among the tied maxima: the positive wins w.p. 1 / n_max
                n_max = 1 + np.count_nonzero(noisy[:, tied] == other[tied], axis=0)
                chosen[tied] = rng.random(tied.size) * n_max < 1.0
            decisions[world, start : start + m] = chosen
    return VotingSimulation(decisions[0], decisions[1], scores[0], scores[1])


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
