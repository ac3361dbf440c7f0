"""Bootstrap auditing (paper 000, Algorithm 1): what every mechanism's simulation shares.

An internal auditor collects ``n_llm`` clean (pre-noise) outputs of the mechanism in each
world and simulates ``n_sample`` noisy releases per world by resampling those rows with
replacement and adding the server's noise. The simulation is the mechanism's own
(:mod:`dpicl_audit.mechanisms.voting.bootstrap`, :mod:`dpicl_audit.mechanisms.esa.simulation`);
this module holds the checks of its inputs and :func:`estimate_simulated`, which turns the
simulated decisions and scores into bounds (counts and a held-out threshold), knowing
nothing of the mechanism."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.counts import AuditEstimate, estimate_from_counts
from dpicl_audit.estimators.held_out import PositiveWhen
from dpicl_audit.estimators.stats import FloatArray
from dpicl_audit.estimators.thresholds import ThresholdEstimate, split_threshold_estimate

__all__ = [
    "CHUNK_ELEMENTS",
    "BootstrapResult",
    "calls_for",
    "check_n_sample",
    "check_sigma",
    "clean_rows",
    "estimate_simulated",
]

CHUNK_ELEMENTS = 1 << 21  # noisy values held at once (16 MiB of float64)


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


def clean_rows(values: npt.ArrayLike, name: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise InvalidAuditInput(f"{name} must be a non-empty 2-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidAuditInput(f"{name} must be finite")
    return arr


def check_sigma(sigma: float) -> float:
    s = float(sigma)
    if not (s >= 0.0 and np.isfinite(s)):
        raise InvalidAuditInput(f"sigma must be finite and non-negative, got {sigma!r}")
    return s


def check_n_sample(n_sample: int) -> int:
    if isinstance(n_sample, bool) or not isinstance(n_sample, int | np.integer) or n_sample < 1:
        raise InvalidAuditInput(f"n_sample must be a positive whole number, got {n_sample!r}")
    return int(n_sample)


def calls_for(n_rows: int, calls_per_row: int) -> int:
    if calls_per_row < 1:
        raise InvalidAuditInput(f"calls_per_row must be at least 1, got {calls_per_row}")
    return n_rows * calls_per_row


def estimate_simulated(
    mechanism: str,
    sigma: float,
    n_sample: int,
    calls: int,
    decisions: tuple[npt.ArrayLike, npt.ArrayLike],
    scores: tuple[FloatArray, FloatArray],
    positive_when: PositiveWhen,
    **kw: Any,
) -> BootstrapResult:
    """Both attacks on simulated trials (with, without): the black-box decisions' counts and
    the held-out threshold on the scores; ``kw``: rng, fraction, confidence, delta, split.
    ``mechanism`` only labels the result (the simulation is the mechanism's own)."""
    tp, fp = (int(np.count_nonzero(d)) for d in decisions)
    black = estimate_from_counts(
        tp, n_sample - tp, fp, n_sample - fp, **{k: kw[k] for k in ("delta", "confidence", "split")}
    )
    white = split_threshold_estimate(*scores, positive_when=positive_when, **kw)
    return BootstrapResult(mechanism, float(sigma), int(n_sample), calls, black, white)
