"""Embedding space aggregation (ESA): Algorithm 3 of paper 000 / Algorithm 4 of paper 004.

Pure functions over numpy arrays; the generator is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["EsaRelease", "esa_release", "esa_sensitivity", "nearest"]

FloatArray = npt.NDArray[np.float64]
SensitivityMode = Literal["tight", "original"]


def esa_sensitivity(partitions: int, mode: SensitivityMode = "tight") -> float:
    """L2 sensitivity of the mean of T unit-norm embeddings under replace-one.

    One partition's embedding u becomes u' with ||u||, ||u'|| <= 1, so the mean moves by
    ||u - u'|| / T <= 2/T (paper 000, Appendix A, tight when u' = -u). The original DP-ICL
    analysis used 1, which over-noises for T > 2.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return 2.0 / partitions if mode == "tight" else 1.0


@dataclass(frozen=True, slots=True)
class EsaRelease:
    index: int
    clean_mean: FloatArray
    noisy_mean: FloatArray
    distances: FloatArray


def nearest(point: FloatArray, candidates: FloatArray, rng: np.random.Generator) -> int:
    """Index of the candidate nearest ``point`` in L2; ties broken uniformly at random."""
    d = np.linalg.norm(candidates - point, axis=1)
    best = np.flatnonzero(d == d.min())
    return int(best[0] if best.size == 1 else rng.choice(best))


def esa_release(
    partition_embeddings: FloatArray,
    candidate_embeddings: FloatArray,
    sigma: float,
    rng: np.random.Generator,
) -> EsaRelease:
    """Noisy mean of the T partition embeddings; release the nearest zero-shot candidate.

    Rows must be unit-norm (the sensitivity bound assumes it; the embedder normalises).
    The noise is N(0, sigma^2 I_d) on the mean (Algorithm 3, lines 7-9).
    """
    emb = np.asarray(partition_embeddings, dtype=np.float64)
    cand = np.asarray(candidate_embeddings, dtype=np.float64)
    if emb.ndim != 2 or cand.ndim != 2 or emb.shape[1] != cand.shape[1]:
        raise ValueError(f"shape mismatch: partitions {emb.shape}, candidates {cand.shape}")
    clean = emb.mean(axis=0)
    noisy = clean + rng.normal(0.0, sigma, size=clean.shape)
    d = np.linalg.norm(cand - noisy, axis=1)
    return EsaRelease(
        index=nearest(noisy, cand, rng), clean_mean=clean, noisy_mean=noisy, distances=d
    )
