"""ESA's exact epsilon and the L2 sensitivity of its mean, computed independently of the
server (dp-accounting's PLD accountant through
:func:`dpicl_audit.estimators.exact.gaussian_epsilon_exact`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.exact import gaussian_epsilon_exact

__all__ = ["esa_epsilon_exact", "esa_mean_sensitivity"]


def esa_epsilon_exact(
    sigma: float, shift: float | npt.NDArray[np.float64], delta: float, count: int = 1
) -> float:
    """epsilon at ``delta`` of ESA's noisy mean when the neighbours' clean means differ by
    ``shift`` (its L2 norm, or the difference vector itself)."""
    norm = float(np.linalg.norm(np.asarray(shift, dtype=np.float64)))
    return gaussian_epsilon_exact(sigma, norm, delta, count)


def esa_mean_sensitivity(partitions: int, *, original: bool = False) -> float:
    """L2 sensitivity of the mean of ``partitions`` unit-norm embeddings: ``2 / T``, or 1 for
    the original paper's setting (``sensitivity: "original"``)."""
    if partitions < 1:
        raise InvalidAuditInput(f"partitions must be at least 1, got {partitions}")
    return 1.0 if original else 2.0 / partitions
