"""Algorithm 1 of paper 000 for ESA, vectorised: noisy means simulated from the clean
partition-mean embeddings collected in each world (:mod:`.bootstrap` reads them).

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

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.bootstrap import (
    BootstrapResult,
    calls_for,
    check_n_sample,
    check_sigma,
    clean_rows,
    estimate_simulated,
)
from dpicl_audit.estimators.stats import ConfidenceSplit, FloatArray

__all__ = ["EsaSimulation", "bootstrap_esa_audit", "simulate_esa"]


@dataclass(frozen=True)
class EsaSimulation:
    """Simulated ESA white-box scores ``||m - e_pos|| - ||m - e_neg||`` in both worlds.

    Lower means "canary present" (the noisy mean is nearer the positive option).
    """

    scores_with: FloatArray
    scores_without: FloatArray


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
    w = clean_rows(emb_with, "emb_with")
    wo = clean_rows(emb_without, "emb_without")
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
    s, n = check_sigma(sigma), check_n_sample(n_sample)
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
    calls = calls_for(int(rows), calls_per_row)
    sim = simulate_esa(emb_with, emb_without, sigma, n_sample, e_pos=e_pos, e_neg=e_neg, rng=rng)
    decisions = (sim.scores_with < 0.0, sim.scores_without < 0.0)  # released: nearer e_pos
    scores = (sim.scores_with, sim.scores_without)
    kw = dict(rng=rng, fraction=fraction, confidence=confidence, delta=delta, split=split)
    return estimate_simulated("esa", sigma, n_sample, calls, decisions, scores, "below", **kw)
