"""Positive controls for ESA: the real dpicl app with one deliberate bug in the mechanism.

Each fault is an object with ``install()`` and ``WARNING`` (:mod:`tests.servers`). Tests
start one with ``start_server(env, fault="tests.e2e.broken_esa_server:SUM")`` (or ``NOISE``);
by hand, from the repository root (settings from ``DPICL_*`` as usual):

    python -m tests.servers tests.e2e.broken_esa_server:SUM PORT

* ``sum``: the partition embeddings are aggregated by their SUM instead of their mean (the
  1/T of Algorithm 3, line 7 of paper 000 forgotten) while the noise stays calibrated for
  the mean's sensitivity 2/T: the release is then T times less private than claimed.
* ``noise``: the noise added to the mean is 4x smaller than the configured sigma.

Everything the server *reports* is unchanged: the context's sigma, epsilon, epsilon_exact,
the ledger's charges and the debug endpoint's ``sigma``. Only the released text shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import dpicl.mechanisms.esa.pipeline as esa_pipeline
from dpicl.mechanisms.esa.release import EsaRelease
from dpicl.mechanisms.esa.release import esa_release as honest_esa_release

NOISE_SHRINK = 4.0


def summing_release(
    partition_embeddings: Any, candidate_embeddings: Any, sigma: float, rng: np.random.Generator
) -> EsaRelease:
    """The honest release of T x the mean (= the sum), with the mean's noise."""
    emb = np.asarray(partition_embeddings, dtype=np.float64)
    return honest_esa_release(emb * emb.shape[0], candidate_embeddings, sigma, rng)


def quiet_release(
    partition_embeddings: Any, candidate_embeddings: Any, sigma: float, rng: np.random.Generator
) -> EsaRelease:
    """The honest release with a quarter of the configured noise."""
    return honest_esa_release(partition_embeddings, candidate_embeddings, sigma / NOISE_SHRINK, rng)


@dataclass(frozen=True, slots=True)
class EsaFault:
    """One positive control: the ESA release the server runs instead of the honest one."""

    release: Callable[[Any, Any, float, np.random.Generator], EsaRelease]
    WARNING: str

    def install(self) -> None:
        """Patch the ESA pipeline in this process (it looks ``esa_release`` up per call)."""
        esa_pipeline.esa_release = self.release  # type: ignore[assignment]


SUM = EsaFault(summing_release, "ESA aggregates the partition embeddings by their sum, not mean")
NOISE = EsaFault(quiet_release, f"ESA noise is {NOISE_SHRINK:g}x smaller than the reported sigma")
