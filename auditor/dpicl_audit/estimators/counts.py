"""The black-box estimate: empirical lower bounds from one attack's confusion counts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.classic import epsilon_lower_classic
from dpicl_audit.estimators.gdp import gdp_epsilon, mu_lower
from dpicl_audit.estimators.stats import (
    ConfidenceSplit,
    check_confidence,
    check_delta,
    per_interval_confidence,
)
from dpicl_audit.jsontypes import JsonObject

__all__ = ["MAX_COUNT", "AuditEstimate", "estimate_from_counts"]


@dataclass(frozen=True)
class AuditEstimate:
    """Empirical lower bounds from one attack's confusion counts.

    ``tp``/``fn`` count the trials run with the canary (positives), ``fp``/``tn`` those
    without. ``mu_lower`` is the GDP lower bound, ``epsilon_lower`` its epsilon at ``delta``,
    ``epsilon_lower_classic`` the classical bound (paper 003, Section 2.2); all three hold
    jointly with probability ``confidence`` (the two one-sided Clopper-Pearson intervals share
    it as ``split`` says). ``tpr``/``fpr`` are the point estimates.
    """

    tp: int
    fn: int
    fp: int
    tn: int
    confidence: float
    delta: float
    mu_lower: float
    epsilon_lower: float
    epsilon_lower_classic: float
    tpr: float
    fpr: float
    split: str = "bonferroni"

    @property
    def n_pos(self) -> int:
        """Trials run with the canary."""
        return self.tp + self.fn

    @property
    def n_neg(self) -> int:
        """Trials run without the canary."""
        return self.fp + self.tn

    def to_dict(self) -> JsonObject:
        """Plain JSON-ready dict of every field (and ``n_pos``, ``n_neg``)."""
        out = asdict(self)
        out["n_pos"] = self.n_pos
        out["n_neg"] = self.n_neg
        return out


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidAuditInput(f"{name} must be a whole number, got {value!r}")
    if value < 0:
        raise InvalidAuditInput(f"{name} must be non-negative, got {value}")
    if value > MAX_COUNT:
        # Past int64 numpy holds counts as Python objects, and past 2^53 floats lose them.
        raise InvalidAuditInput(f"{name} must be at most {MAX_COUNT} (2^53), got {value}")
    return int(value)


#: Largest attack count taken (far beyond any audit; exact as a float).
MAX_COUNT = 2**53


def estimate_from_counts(
    tp: int,
    fn: int,
    fp: int,
    tn: int,
    *,
    delta: float,
    confidence: float = 0.95,
    split: ConfidenceSplit = "bonferroni",
) -> AuditEstimate:
    """Lower bounds (GDP mu and epsilon, classical epsilon) from an attack's counts.

    Raises :class:`~dpicl_audit.errors.InvalidAuditInput` (a ``ValueError``) for negative or
    non-integer counts, no positive or no negative trials, or ``confidence``/``delta`` outside
    (0, 1).
    """
    counts = {name: _count(v, name) for name, v in (("tp", tp), ("fn", fn), ("fp", fp), ("tn", tn))}
    c = check_confidence(confidence)
    d = check_delta(delta)
    per_interval_confidence(c, 2, split)  # validates split
    n_pos = counts["tp"] + counts["fn"]
    n_neg = counts["fp"] + counts["tn"]
    if n_pos == 0 or n_neg == 0:
        raise InvalidAuditInput(
            f"need at least one trial with and one without the canary, got "
            f"tp+fn={n_pos}, fp+tn={n_neg}"
        )
    mu = mu_lower(counts["fp"], n_neg, counts["fn"], n_pos, c, split=split)
    return AuditEstimate(
        tp=counts["tp"],
        fn=counts["fn"],
        fp=counts["fp"],
        tn=counts["tn"],
        confidence=c,
        delta=d,
        mu_lower=mu,
        epsilon_lower=gdp_epsilon(mu, d),
        epsilon_lower_classic=epsilon_lower_classic(
            counts["fp"], n_neg, counts["fn"], n_pos, d, c, split=split
        ),
        tpr=counts["tp"] / n_pos,
        fpr=counts["fp"] / n_neg,
        split=split,
    )
