"""White-box estimates never weaker than black-box, and both figures from one set of trials.

**Why a new selection.** :func:`~dpicl_audit.estimators.thresholds.split_threshold_estimate`
bounds on the held-out part of the trials (the rest chooses the threshold) and selects at confidence
``1 - 1e-9``; on weak signals it loses to the black-box decision evaluated on all trials
(issue 14: 0 against 0.24-0.30 at epsilon 1, 10,000 trials). Here, as in jax_privacy's
``CanaryScoreAuditor`` (strategies ``Explicit``, ``Split`` and ``Bonferroni``), the estimate is
the better of a few *pre-registered* tests, with a union bound over them:

1. the black-box decision itself (a fixed rule, chosen before seeing any trial), evaluated on
   **all** trials, at error ``share * (1 - confidence)``;
2. one threshold on the score, chosen on a random ``fraction`` of the trials and evaluated on
   the rest, at error ``(1 - share) * (1 - confidence)``.

The reported bound is the larger of the two; the probability that either interval fails is at
most ``1 - confidence`` (Bonferroni), so the bound holds at ``confidence`` whatever the data.
Hence ``white >= black`` at confidence ``1 - share (1 - confidence)`` on the same trials,
deterministically: the price of never being weaker is that Bonferroni factor.

**Selection that does not drift to the tails.** The threshold is chosen only among the vertices
of the upper convex hull of the selection part's empirical ROC (a point under the hull is
beaten by a mixture of two others, and jagged tail points are what the hull removes), and by
the bound it *predicts for the held-out part*: the selection part's error rates, taken at
their 90% Clopper-Pearson upper bounds (a zero count on the selection part is no zero rate),
rescaled to the held-out sizes, then Clopper-Pearson at the held-out confidence. A tail
threshold with a handful of counts is charged both uncertainties, so it wins only when it
would win on the held-out part too.

:func:`audit_figures` reports both figures: the GDP figure (``mu_lower`` and its epsilon, a
statement that holds under a Gaussian trade-off) and the assumption-free classical bound, each
with its own threshold and half of the error budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.counts import AuditEstimate, estimate_from_counts
from dpicl_audit.estimators.held_out import (
    DEFAULT_SELECTION_FRACTION,
    BoundFields,
    Objective,
    PositiveWhen,
    check_objective,
    check_scores,
    held_out_bound,
    objective_values,
    orientation,
)
from dpicl_audit.estimators.stats import (
    BoolArray,
    ConfidenceSplit,
    FloatArray,
    check_confidence,
    check_delta,
    clopper_pearson_upper,
    per_interval_confidence,
)
from dpicl_audit.jsontypes import JsonObject

__all__ = [
    "CLASSICAL_LABEL",
    "GAUSSIAN_LABEL",
    "AuditFigures",
    "WhiteBoxEstimate",
    "audit_figures",
    "counts_figures",
    "figure_test_confidences",
    "roc_hull",
    "whitebox_estimate",
]

_SELECTION_RATE_CONFIDENCE = 0.9
"""One-sided confidence of the selection part's rate estimates used to predict held-out counts."""

GAUSSIAN_LABEL = (
    "GDP figure: the mechanism is not mu-GDP for any mu < mu_lower; its epsilon assumes a "
    "Gaussian trade-off (fair only against a Gaussian claim)"
)
CLASSICAL_LABEL = "classical (epsilon, delta) lower bound: assumption-free"


@dataclass(frozen=True)
class WhiteBoxEstimate(BoundFields):
    """The better of the black-box rule (all trials) and a held-out threshold.

    ``chosen`` says which won (``"black_box"`` or ``"threshold"``); ``estimate`` is its
    :class:`~dpicl_audit.estimators.AuditEstimate` (its ``confidence`` field is the share the
    winning test was evaluated at; the combined statement holds at ``confidence``).
    ``black_box``/``held_out`` are both tests (``black_box`` is ``None`` without decisions).
    """

    objective: Objective
    confidence: float
    chosen: Literal["black_box", "threshold"]
    estimate: AuditEstimate
    black_box: AuditEstimate | None
    held_out: AuditEstimate
    threshold: float
    positive_when: PositiveWhen
    fraction: float
    share: float

    @property
    def bound(self) -> AuditEstimate:
        return self.estimate

    def value(self) -> float:
        """The objective's value: ``mu_lower`` or the classical epsilon."""
        return _value(self.estimate, self.objective)

    def to_dict(self) -> JsonObject:
        """JSON-ready dict: the combined figure at top level, both tests below."""
        return {
            "objective": self.objective,
            "confidence": self.confidence,
            "chosen": self.chosen,
            "threshold": self.threshold,
            "positive_when": self.positive_when,
            "selection_fraction": self.fraction,
            "black_box_share": self.share,
            **{k: v for k, v in self.estimate.to_dict().items() if k != "confidence"},
            "black_box": None if self.black_box is None else self.black_box.to_dict(),
            "held_out": self.held_out.to_dict(),
        }


def _value(e: AuditEstimate, objective: Objective) -> float:
    return e.mu_lower if objective == "mu" else e.epsilon_lower_classic


def _decisions(values: npt.ArrayLike | None, size: int, name: str) -> BoolArray | None:
    if values is None:
        return None
    arr = np.asarray(values)
    if arr.shape != (size,):
        raise InvalidAuditInput(
            f"{name} must hold one decision per score ({size}), got {arr.shape}"
        )
    if arr.dtype != np.bool_ and not np.all((arr == 0) | (arr == 1)):
        raise InvalidAuditInput(f"{name} must hold booleans (or 0/1)")
    return arr.astype(np.bool_)


def roc_hull(pos: FloatArray, neg: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Thresholds, FPR and TPR of the upper-convex-hull vertices of the empirical ROC of
    "positive iff score > tau" (scores oriented so that larger means "canary present")."""
    pos_s, neg_s = np.sort(pos), np.sort(neg)
    cand = np.unique(np.concatenate([neg_s, pos_s]))
    taus = np.concatenate([[cand[0] - 1.0], cand])  # first: everything positive
    fpr = (neg_s.size - np.searchsorted(neg_s, taus, side="right")) / neg_s.size
    tpr = (pos_s.size - np.searchsorted(pos_s, taus, side="right")) / pos_s.size
    # Points ordered by increasing FPR (taus decreasing); monotone-chain upper hull.
    order = np.arange(taus.size)[::-1]
    hull: list[int] = []
    for i in order:
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (fpr[b] - fpr[a]) * (tpr[i] - tpr[a]) - (tpr[b] - tpr[a]) * (fpr[i] - fpr[a])
            if cross >= 0.0:  # b lies on or under the chord a-i
                hull.pop()
            else:
                break
        hull.append(int(i))
    idx = np.array(hull, dtype=np.int64)
    return taus[idx], fpr[idx], tpr[idx]


def _predicted_choice(
    pos: FloatArray,
    neg: FloatArray,
    n_hold_pos: int,
    n_hold_neg: int,
    c_each: float,
    delta: float,
    objective: Objective,
) -> float:
    taus, fpr, tpr = roc_hull(pos, neg)
    # Pessimistic selection rates: a zero count on the selection part does not mean a zero
    # rate on the held-out part (the tail drift of issue 14).
    fpr_sel = clopper_pearson_upper(np.round(fpr * neg.size), neg.size, _SELECTION_RATE_CONFIDENCE)
    fnr_sel = clopper_pearson_upper(
        np.round((1.0 - tpr) * pos.size), pos.size, _SELECTION_RATE_CONFIDENCE
    )
    fp = np.round(fpr_sel * n_hold_neg)
    fn = np.round(fnr_sel * n_hold_pos)
    values = objective_values(
        clopper_pearson_upper(fp, n_hold_neg, c_each),
        clopper_pearson_upper(fn, n_hold_pos, c_each),
        objective,
        delta,
    )
    best = np.flatnonzero(values == values.max())
    return float(taus[best[best.size // 2]])  # ties (e.g. all 0): the middle one


def whitebox_estimate(
    scores_pos: npt.ArrayLike,
    scores_neg: npt.ArrayLike,
    *,
    rng: np.random.Generator,
    delta: float,
    confidence: float = 0.95,
    black_box_pos: npt.ArrayLike | None = None,
    black_box_neg: npt.ArrayLike | None = None,
    fraction: float = DEFAULT_SELECTION_FRACTION,
    share: float = 0.5,
    objective: Objective = "mu",
    positive_when: PositiveWhen = "above",
    split: ConfidenceSplit = "bonferroni",
) -> WhiteBoxEstimate:
    """White-box bound at ``confidence``, never weaker than the black-box rule (module doc).

    ``black_box_pos``/``black_box_neg``: the black-box decisions (True = "canary present") of
    the same trials, aligned with the scores; without them ``share`` is ignored and the whole
    error budget goes to the held-out threshold. ``fraction`` of each world's trials choose
    the threshold. ``split`` shares each test's confidence between its two intervals.
    """
    sign = orientation(positive_when)
    pos = sign * check_scores(scores_pos, "scores_pos", min_size=2)
    neg = sign * check_scores(scores_neg, "scores_neg", min_size=2)
    obj = check_objective(objective)
    c = check_confidence(confidence)
    d = check_delta(delta)
    bb_pos = _decisions(black_box_pos, pos.size, "black_box_pos")
    bb_neg = _decisions(black_box_neg, neg.size, "black_box_neg")
    if (bb_pos is None) != (bb_neg is None):
        raise InvalidAuditInput("give black-box decisions for both worlds or for neither")
    s = float(share)
    if bb_pos is None:
        s = 0.0
    elif not 0.0 < s < 1.0:
        raise InvalidAuditInput(f"share must lie strictly between 0 and 1, got {share!r}")
    c_black, c_thr = _test_shares(c, s)
    c_each = per_interval_confidence(c_thr, 2, split)

    def select(sel_pos: FloatArray, sel_neg: FloatArray, n_pos: int, n_neg: int) -> float:
        return _predicted_choice(sel_pos, sel_neg, n_pos, n_neg, c_each, d, obj)

    part = held_out_bound(
        pos, neg, rng=rng, fraction=fraction, select=select, delta=d, confidence=c_thr, split=split
    )
    held = part.estimate
    black = None
    if bb_pos is not None and bb_neg is not None:
        btp, bfp = int(bb_pos.sum()), int(bb_neg.sum())
        black = estimate_from_counts(
            btp,
            pos.size - btp,
            bfp,
            neg.size - bfp,
            delta=d,
            confidence=c_black,
            split=split,
        )

    use_black = black is not None and _value(black, obj) >= _value(held, obj)
    return WhiteBoxEstimate(
        objective=objective,
        confidence=c,
        chosen="black_box" if use_black else "threshold",
        estimate=black if use_black and black is not None else held,
        black_box=black,
        held_out=held,
        threshold=sign * part.tau,
        positive_when=positive_when,
        fraction=part.fraction,
        share=s,
    )


@dataclass(frozen=True)
class AuditFigures:
    """Both figures from the same trials, jointly valid at ``confidence``.

    ``mu_lower``/``epsilon_gdp``: the GDP figure (``gdp_label``); ``epsilon_classical``: the
    assumption-free bound (``classical_label``), with its own threshold where there are scores.
    ``gdp``/``classical``: the estimates behind them (white-box: :class:`WhiteBoxEstimate`).
    """

    confidence: float
    delta: float
    mu_lower: float
    epsilon_gdp: float
    epsilon_classical: float
    gdp: WhiteBoxEstimate | AuditEstimate
    classical: WhiteBoxEstimate | AuditEstimate
    gdp_label: str = GAUSSIAN_LABEL
    classical_label: str = CLASSICAL_LABEL

    def to_dict(self) -> JsonObject:
        """JSON-ready dict with both figures and their labels."""
        return {
            "confidence": self.confidence,
            "delta": self.delta,
            "gdp": {
                "mu_lower": self.mu_lower,
                "epsilon": self.epsilon_gdp,
                "label": self.gdp_label,
                "detail": self.gdp.to_dict(),
            },
            "classical": {
                "epsilon": self.epsilon_classical,
                "label": self.classical_label,
                "detail": self.classical.to_dict(),
            },
        }


def counts_figures(
    tp: int, fn: int, fp: int, tn: int, *, delta: float, confidence: float = 0.95
) -> AuditFigures:
    """Both figures of a black-box (fixed-rule) audit: one pair of intervals serves both, so
    they hold jointly at ``confidence`` with no further split."""
    est = estimate_from_counts(tp, fn, fp, tn, delta=delta, confidence=confidence)
    return AuditFigures(
        confidence=est.confidence,
        delta=est.delta,
        mu_lower=est.mu_lower,
        epsilon_gdp=est.epsilon_lower,
        epsilon_classical=est.epsilon_lower_classic,
        gdp=est,
        classical=est,
    )


def _figure_confidence(confidence: float) -> float:
    """Each of :func:`audit_figures`' two figures holds at this, so that the pair holds at
    ``confidence``."""
    return 1.0 - (1.0 - confidence) / 2.0


def _test_shares(confidence: float, share: float) -> tuple[float, float]:
    """The confidences of a white-box figure's two tests, the black-box rule with ``share``
    of the error and the held-out threshold with the rest (Bonferroni)."""
    return 1.0 - share * (1.0 - confidence), 1.0 - (1.0 - share) * (1.0 - confidence)


def figure_test_confidences(confidence: float, share: float = 0.5) -> tuple[float, float]:
    """The confidences the black-box rule and the held-out threshold of a white-box figure
    of :func:`audit_figures` at ``confidence`` are evaluated at (each figure at its half of
    the error, each test at its ``share`` of the figure's): what a power model of that
    figure must use."""
    return _test_shares(_figure_confidence(check_confidence(confidence)), share)


def audit_figures(
    scores_pos: npt.ArrayLike,
    scores_neg: npt.ArrayLike,
    *,
    rng: np.random.Generator,
    delta: float,
    confidence: float = 0.95,
    black_box_pos: npt.ArrayLike | None = None,
    black_box_neg: npt.ArrayLike | None = None,
    fraction: float = DEFAULT_SELECTION_FRACTION,
    positive_when: PositiveWhen = "above",
) -> AuditFigures:
    """Both figures of a white-box audit, each with its own threshold (:func:`whitebox_estimate`
    with ``objective="mu"`` and ``"epsilon_classic"``), each at ``1 - (1 - confidence) / 2`` so
    that the pair (and any verdict reading either) holds at ``confidence``."""
    c = check_confidence(confidence)
    each = _figure_confidence(c)
    kw: dict[str, Any] = {
        "delta": delta,
        "confidence": each,
        "black_box_pos": black_box_pos,
        "black_box_neg": black_box_neg,
        "fraction": fraction,
        "positive_when": positive_when,
    }
    state = rng.bit_generator.state
    figures: list[WhiteBoxEstimate] = []
    for objective in ("mu", "epsilon_classic"):
        rng.bit_generator.state = state  # one split for both: the same selection trials
        figures.append(
            whitebox_estimate(scores_pos, scores_neg, rng=rng, objective=objective, **kw)
        )
    gdp, classical = figures
    return AuditFigures(
        confidence=c,
        delta=gdp.estimate.delta,  # checked by the estimate's counts
        mu_lower=gdp.mu_lower,
        epsilon_gdp=gdp.epsilon_lower,
        epsilon_classical=classical.epsilon_lower_classic,
        gdp=gdp,
        classical=classical,
    )
