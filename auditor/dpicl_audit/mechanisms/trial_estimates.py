"""Estimates of a real-query run shared by the mechanisms: the black-box rule's counts and the
white-box figures (:func:`~dpicl_audit.estimators.whitebox.audit_figures`: never weaker than
the black-box rule, GDP and classical figures each with its own threshold), with verdicts;
and the last step of every setting, its conformance read into those verdicts. Each returns
the typed results (:class:`~dpicl_audit.results.Estimate`,
:class:`~dpicl_audit.results.SettingResult`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np

from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.conformance import (
    Conformance,
    ConformanceTest,
    conformance_alpha,
)
from dpicl_audit.estimators.counts import estimate_from_counts
from dpicl_audit.estimators.exchangeable import order_can_inform, repeat_test
from dpicl_audit.estimators.family import figure_record, figure_tests
from dpicl_audit.estimators.roc import roc_from_decisions, roc_from_scores
from dpicl_audit.estimators.whitebox import (
    CLASSICAL_LABEL,
    GAUSSIAN_LABEL,
    AuditFigures,
    audit_figures,
)
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import STREAM_SPLIT
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.store import TrialRecord
from dpicl_audit.verdicts import gaussian_verdict

__all__ = [
    "Finish",
    "estimate_trials",
    "figure_fields",
    "finish_conformance",
    "released_answers",
    "with_verdict",
]

#: How an estimate gets its verdict from the setting's claims (:func:`with_verdict`).
Finish = Callable[[Estimate, SettingClaims], Estimate]


def with_verdict(est: Estimate, claims: SettingClaims) -> Estimate:
    """The estimate with its verdict against the setting's claims (and, where it has only
    its decision counts, e.g. a bootstrap's, the ROC of that operating point)."""
    est = est.updated(verdict=gaussian_verdict(est, claims))
    if "roc" not in est.extra and est.counts is not None:
        est = est.updated(roc=roc_from_decisions(*est.counts))
    return est


def estimate_trials(
    plan: AuditPlan,
    k: int,
    rows: Sequence[TrialRecord],
    claims: SettingClaims,
    *,
    calls_per_query: int,
    positive_when: Literal["above", "below"] = "above",
    finish: Finish = with_verdict,
    black_box_claims: SettingClaims | None = None,
) -> SettingResult:
    """Per-epsilon estimates of a real-query run: black-box from the logged decisions,
    white-box from the logged scores (positive above the threshold, or below it), the
    threshold chosen on a seeded held-out split (DESIGN.md section 5). ``black_box_claims``:
    what the black-box figure's verdict reads where it is not the setting's claims (e.g.
    voting's release reference on the simulator)."""

    worlds = np.array([r.world for r in rows], dtype=np.int64)
    decisions = np.array([r.decision or 0 for r in rows], dtype=np.int64)
    n1, n0 = int(np.sum(worlds == 1)), int(np.sum(worlds == 0))
    head = claims.to_json() | {
        "trials": len(rows),
        "n_with": n1,
        "n_without": n0,
        "llm_calls": len(rows) * calls_per_query,
    }
    tp = int(np.sum(decisions[worlds == 1]))
    fp = int(np.sum(decisions[worlds == 0]))
    try:
        counts = estimate_from_counts(
            tp, n1 - tp, fp, n0 - fp, delta=plan.mechanism.delta, confidence=plan.confidence
        ).to_dict()
        labels = {"gdp_label": GAUSSIAN_LABEL, "classical_label": CLASSICAL_LABEL}
        roc = {"roc": roc_from_decisions(tp, n1 - tp, fp, n0 - fp)}
        bb = finish(Estimate.of(**(counts | labels | roc)), black_box_claims or claims)
    except InvalidAuditInput as exc:
        bb = Estimate.of(error=str(exc))
    wb: Estimate | None = None
    scores = [r.score for r in rows]
    if plan.threat_model == "white-box" and rows and all(s is not None for s in scores):
        arr = np.array(scores, dtype=np.float64)
        w1, w0 = worlds == 1, worlds == 0
        try:
            # Never weaker than black-box: the black-box rule is one pre-registered candidate
            # (estimators.whitebox); each figure gets its own threshold.
            figs = audit_figures(
                arr[w1],
                arr[w0],
                rng=np.random.default_rng([plan.seed, STREAM_SPLIT, k]),
                delta=plan.mechanism.delta,
                confidence=plan.confidence,
                black_box_pos=decisions[w1].astype(bool),
                black_box_neg=decisions[w0].astype(bool),
                fraction=plan.split,
                positive_when=positive_when,
            )
            sign = 1.0 if positive_when == "above" else -1.0
            roc = {"roc": roc_from_scores(sign * arr[w1], sign * arr[w0])}
            wb = finish(Estimate.of(**(figs.gdp.to_dict() | figure_fields(figs) | roc)), claims)
        except InvalidAuditInput as exc:
            wb = Estimate.of(error=str(exc))
    return SettingResult.of(**(head | {"black_box": bb, "white_box": wb}))


def figure_fields(figs: AuditFigures) -> dict[str, object]:
    """Both figures' headline fields of an :class:`~dpicl_audit.estimators.whitebox.
    AuditFigures`: the classical bound with its own threshold and tests, and the labels."""

    classical = figs.classical
    return {
        "epsilon_lower_classic": figs.epsilon_classical,
        "classical_threshold": getattr(classical, "threshold", None),
        # The classical figure's own tests (its own threshold), for family-wise claims.
        "classical_tests": figure_tests(figure_record(classical.to_dict())),
        "gdp_label": GAUSSIAN_LABEL,
        "classical_label": CLASSICAL_LABEL,
    }


def released_answers(rows: Sequence[TrialRecord], key: str) -> dict[int, list[str]]:
    """Each world's released answers (``observation[key]``), in trial order."""
    ordered = sorted(rows, key=lambda r: r.trial_index)
    return {w: [str(r.observation.get(key)) for r in ordered if r.world == w] for w in (1, 0)}


def finish_conformance(
    out: SettingResult,
    claims: SettingClaims,
    black: list[ConformanceTest],
    white: list[ConformanceTest],
    *,
    answers: Mapping[int, Sequence[str]] | None = None,
    seed: Sequence[int] = (),
) -> SettingResult:
    """Store the setting's conformance (the release's tests, the noise's, and both) and read
    every verdict of the setting with all of them. ``answers``: each world's released
    answers in trial order (:func:`released_answers`), whose order is tested too
    (:mod:`dpicl_audit.estimators.exchangeable`, generators seeded by ``seed`` and the world):
    the model-free prediction every mechanism makes of repeated identical queries."""
    informative = {w: a for w, a in (answers or {}).items() if order_can_inform(a)}
    alpha = conformance_alpha(claims.family, len(black) + len(white) + len(informative))
    order = (
        repeat_test(
            a,
            alpha=alpha,
            rng=np.random.default_rng([*seed, w]),
            name=f"C{w} answers in trial order",
        )
        for w, a in informative.items()
    )
    black = black + [t for t in order if t is not None]
    bb = Conformance(alpha, tuple(black)).to_dict()
    both = Conformance(alpha, tuple(black + white)).to_dict()
    conformance = {
        "status": both["status"],
        "alpha": alpha,
        "differs": both["differs"],
        "message": both["message"],
        "black_box": bb,
        "white_box": Conformance(alpha, tuple(white)).to_dict(),
    }
    # A departure anywhere means the server does not run the mechanism it reports: every
    # figure of the setting reads it (a VIOLATION or BUG stays, naming it too).
    read = {
        key: est.updated(verdict=est.verdict.read_with(both))
        for key, est in (("black_box", out.black_box), ("white_box", out.white_box))
        if est is not None and est.verdict is not None
    }
    return out.updated(conformance=conformance, **read)
