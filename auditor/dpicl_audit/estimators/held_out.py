"""The held-out part of a white-box threshold attack, shared by both white-box estimates.

A threshold chosen on the very trials its bound is computed from biases the bound upward (a
maximum over many correlated tests). :func:`held_out_bound` splits each world's trials at
random, lets a selection rule see only the selection part, and bounds the chosen rule on the
held-out rest, where it is a fixed, data-independent test and the Clopper-Pearson guarantee
holds as stated, whatever the rule chose. :mod:`.thresholds` (grid search of the in-sample
bound) and :mod:`.whitebox` (ROC-hull vertices by the bound they predict for the held-out
part) are two such rules; this module also holds the input checks and the objective they
share, and :class:`BoundFields`, which reads a result's counts and bounds through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.classic import classic_epsilon_from_rates
from dpicl_audit.estimators.counts import AuditEstimate, estimate_from_counts
from dpicl_audit.estimators.gdp import mu_from_rates
from dpicl_audit.estimators.stats import ConfidenceSplit, FloatArray

__all__ = [
    "DEFAULT_SELECTION_FRACTION",
    "BoundFields",
    "HeldOut",
    "Objective",
    "PositiveWhen",
    "Selector",
    "check_objective",
    "check_scores",
    "held_out_bound",
    "objective_values",
    "orientation",
]

#: The share of each world's trials that chooses a white-box threshold (the plan's ``split``),
#: by measured power (issue 35, item 9; ``bench/whitebox_split.py``, numbers in
#: docs/auditing.md, "The split, by measured power"): on continuous Gaussian scores 0.2
#: certified as much as 0.1 and more than 0.3 or 0.5, but on a bootstrap's heavily tied scores
#: a 0.2 selection chose a tail threshold and certified epsilon_lower 0 where 0.5 certifies a
#: positive bound; so 0.5, and ``--split 0.2`` for the noisy votes of a real run.
DEFAULT_SELECTION_FRACTION = 0.5

Objective = Literal["mu", "epsilon_classic"]
PositiveWhen = Literal["above", "below"]
Selector = Callable[[FloatArray, FloatArray, int, int], float]
"""``select(sel_pos, sel_neg, n_hold_pos, n_hold_neg) -> tau`` on oriented selection scores."""


class BoundFields:
    """The counts and bounds of the :class:`~dpicl_audit.estimators.AuditEstimate` that carries
    a white-box statement (``bound``), read through as attributes of the result."""

    @property
    def bound(self) -> AuditEstimate:
        raise NotImplementedError

    @property
    def tp(self) -> int:
        return self.bound.tp

    @property
    def fn(self) -> int:
        return self.bound.fn

    @property
    def fp(self) -> int:
        return self.bound.fp

    @property
    def tn(self) -> int:
        return self.bound.tn

    @property
    def mu_lower(self) -> float:
        return self.bound.mu_lower

    @property
    def epsilon_lower(self) -> float:
        return self.bound.epsilon_lower

    @property
    def epsilon_lower_classic(self) -> float:
        return self.bound.epsilon_lower_classic


def check_scores(values: npt.ArrayLike, name: str, *, min_size: int = 1) -> FloatArray:
    """``values`` as a finite 1-D float array of at least ``min_size`` scores."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise InvalidAuditInput(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidAuditInput(f"{name} must not be empty")
    if arr.size < min_size:
        raise InvalidAuditInput(f"{name} must hold >= {min_size} scores, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise InvalidAuditInput(f"{name} must be finite (no NaN or infinity)")
    return arr


def orientation(positive_when: PositiveWhen) -> float:
    """The sign that turns scores into "larger means canary present"."""
    if positive_when == "above":
        return 1.0
    if positive_when == "below":
        return -1.0
    raise InvalidAuditInput(f"positive_when must be 'above' or 'below', got {positive_when!r}")


def check_objective(objective: Objective) -> Objective:
    if objective not in ("mu", "epsilon_classic"):
        raise InvalidAuditInput(f"objective must be 'mu' or 'epsilon_classic', got {objective!r}")
    return objective


def objective_values(fpr_u: Any, fnr_u: Any, objective: Objective, delta: float) -> FloatArray:
    """The objective at upper rate bounds: mu lower bound, or the classical epsilon bound."""
    if objective == "mu":
        return mu_from_rates(fpr_u, fnr_u)
    return classic_epsilon_from_rates(fpr_u, fnr_u, delta)


@dataclass(frozen=True)
class HeldOut:
    """A threshold ``tau`` on oriented scores, chosen on ``n_select_pos``/``n_select_neg``
    trials, and ``estimate``: the bound of its counts on the held-out rest."""

    tau: float
    estimate: AuditEstimate
    fraction: float
    n_select_pos: int
    n_select_neg: int


def held_out_bound(
    pos: FloatArray,
    neg: FloatArray,
    *,
    rng: np.random.Generator,
    fraction: float,
    select: Selector,
    delta: float,
    confidence: float,
    split: ConfidenceSplit,
) -> HeldOut:
    """Split each world's oriented scores at random (``fraction`` selects), let ``select``
    choose ``tau`` on the selection part alone, and bound "positive iff score > tau" on the
    held-out part at ``confidence``. The held-out part never reaches ``select``, so ``tau`` is a
    fixed test for it and the Clopper-Pearson guarantee holds whatever ``select`` does.
    """
    f = float(fraction)
    if not 0.0 < f < 1.0:
        raise InvalidAuditInput(f"fraction must lie strictly between 0 and 1, got {fraction!r}")
    n_sel_pos = int(pos.size * f)
    n_sel_neg = int(neg.size * f)
    if min(n_sel_pos, n_sel_neg) < 1 or n_sel_pos >= pos.size or n_sel_neg >= neg.size:
        raise InvalidAuditInput(
            f"fraction={f} leaves an empty selection or held-out part "
            f"({pos.size} positive and {neg.size} negative scores)"
        )
    perm_pos = rng.permutation(pos.size)
    perm_neg = rng.permutation(neg.size)
    sel_pos, hold_pos = pos[perm_pos[:n_sel_pos]], pos[perm_pos[n_sel_pos:]]
    sel_neg, hold_neg = neg[perm_neg[:n_sel_neg]], neg[perm_neg[n_sel_neg:]]
    tau = select(sel_pos, sel_neg, hold_pos.size, hold_neg.size)
    tp = int(np.count_nonzero(hold_pos > tau))
    fp = int(np.count_nonzero(hold_neg > tau))
    held = estimate_from_counts(
        tp,
        hold_pos.size - tp,
        fp,
        hold_neg.size - fp,
        delta=delta,
        confidence=confidence,
        split=split,
    )
    return HeldOut(tau, held, f, n_sel_pos, n_sel_neg)
