"""Private voting's estimates of one setting, read top-down: the exact epsilons beside them
(:func:`release_claims`), the trials' figures (or the bootstrap's, :mod:`.bootstrap`), then the
setting's conformance tests read into every verdict, and a real run's response fields; and paper
003's RDP audit of a query sequence (:mod:`.rdp_estimates`).

The conformance tests (:mod:`dpicl_audit.estimators.conformance`):

* black-box: on the simulator (clean votes known: the design's), the positive answer's
  release rate in each world against the closed form ``claims.release_rates``; on any
  engine, the order of each world's released labels (model-free:
  :mod:`dpicl_audit.estimators.exchangeable`);
* white-box: the noise ``noisy - clean`` per label (clean from the ``internal`` debug
  endpoint, else the design's on the simulator); without either, determinism alone (a
  continuous noise never repeats a noisy histogram);
* bootstrap runs: the same noise tests on the collected debug rows; a noise check that says
  "smaller than claimed" is NONCONFORMING (noise scale) too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from dpicl_audit.catalog.settings import PartitionedSettings
from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.estimators.conformance import (
    ConformanceTest,
    determinism_test,
    rate_tests,
    residual_tests,
)
from dpicl_audit.estimators.extra_fields import Dependence, dependence_test
from dpicl_audit.estimators.label_release import label_release_epsilon, label_release_probabilities
from dpicl_audit.jsontypes import JsonMapping, json_float, json_int, json_object
from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.mechanisms.gaussian import GaussianFacts
from dpicl_audit.mechanisms.trial_estimates import (
    estimate_trials,
    finish_conformance,
    released_answers,
)
from dpicl_audit.mechanisms.voting.bootstrap import estimate_voting_bootstrap
from dpicl_audit.mechanisms.voting.design import AuditDesign, design_votes
from dpicl_audit.mechanisms.voting.rdp import RdpDesign
from dpicl_audit.mechanisms.voting.rdp_estimates import estimate_rdp
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import STREAM_ORDER
from dpicl_audit.results import SettingResult
from dpicl_audit.store import TrialRecord
from dpicl_audit.verdicts import Status, Verdict

__all__ = [
    "estimate_sequence",
    "estimate_votes",
    "release_claims",
    "release_reference",
    "voting_conformance",
]


def release_claims(
    claims: SettingClaims, design: AuditDesign | RdpDesign, plan: AuditPlan
) -> SettingClaims:
    """The claims with, where the noise sigma is known, the released label's own exact
    epsilon at the design's intended clean votes (the ceiling of the assumption-free
    black-box bound) and its release rates. Paper 003's query sequences have no single
    release (so no release epsilon)."""
    sigma = claims.sigma
    if isinstance(design, RdpDesign) or sigma is None:
        return claims
    with_v, without_v = design_votes(design, PartitionedSettings.of(plan).partitions)
    p1, p0 = (float(label_release_probabilities(v, sigma)[0]) for v in (with_v, without_v))
    return replace(
        claims,
        epsilon_exact_release=label_release_epsilon(with_v, without_v, sigma, claims.delta),
        release_rates=(p1, p0),
    )


def release_reference(claims: SettingClaims, attack: str, setting: str) -> SettingClaims | None:
    """The claims the black-box figure reads on the simulator, whose clean votes are exactly
    the design's: the released label's own exact epsilon ``epsilon_exact_release`` is the
    reference where it is below the worst case (issue 27: a bound above the design's own
    exact epsilon is a BUG, e.g. a tail gap that a bounded noise never crosses). None
    elsewhere (a real model's votes may differ from the design's)."""
    rel, exact = claims.epsilon_exact_release, claims.epsilon_exact
    # Only the membership prompt's votes are the design's on the simulator (a deployment's
    # classification prompt is answered by the most similar demonstration's label), and
    # only at temperature 0 (the caller passes no setting otherwise).
    known = claims.simulator and attack == "inquery" and setting == "audit-template"
    if not known or rel is None or exact is None or rel >= exact:
        return None
    # The classical figure only: the release's trade-off is not a Gaussian's, so the GDP
    # figure stays read against the mechanism's own mu; power stays judged against the
    # worst case (a weak design must not read as having power).
    return claims.with_design_reference(rel, gaussian=False)


def estimate_votes(s: SettingRows, calls_per_query: int) -> SettingResult:
    """One setting's estimates: the trials' figures (the black-box one read against the
    release's own epsilon where :func:`release_reference` gives one), or Algorithm 1 of paper
    000's (``bootstrap``); then the setting's conformance (:func:`voting_conformance`)."""
    plan, design, k, rows, claims = s.plan, s.design, s.k, s.rows, s.claims
    temperature = PartitionedSettings.of(plan).temperature
    if not s.bootstrap:
        ref = release_reference(claims, design.attack, plan.setting if temperature == 0 else "")
        out = estimate_trials(
            plan, k, rows, claims, calls_per_query=calls_per_query, black_box_claims=ref
        )
    else:
        out = estimate_voting_bootstrap(plan, design, k, rows, claims)
        # the setting's own debug rows (the clean log holds every setting's)
        ids = claims.context_id_set()
        rows = [r for r in rows if r.context_id in ids]
    return voting_conformance(
        design,
        out,
        rows,
        claims,
        temperature=temperature,
        bootstrap=s.bootstrap,
        known_votes=plan.setting == "audit-template",
        seed=[plan.seed, k, STREAM_ORDER],
    )


def voting_conformance(
    design: AuditDesign,
    out: SettingResult,
    rows: Sequence[TrialRecord],
    claims: SettingClaims,
    *,
    temperature: float,
    bootstrap: bool = False,
    known_votes: bool = True,
    seed: Sequence[int] = (),
) -> SettingResult:
    """The setting's conformance tests (module docstring), read into every verdict of the
    setting (:func:`~dpicl_audit.mechanisms.trial_estimates.finish_conformance`); then, on a
    real run where any trial logged a response field, the fields' dependence test (issue 35,
    item 1; :func:`~dpicl_audit.estimators.extra_fields.dependence_test`) under
    ``response_fields``: a dependent field makes the black-box verdict a VIOLATION that names
    it. ``known_votes``: the simulator's votes are the design's (the membership prompt of the
    audit template; a deployment's classification prompt is answered by the most similar
    demonstration)."""
    black: list[ConformanceTest] = []
    white: list[ConformanceTest] = []
    simulator = claims.simulator and float(temperature) == 0.0 and known_votes
    rates = claims.release_rates
    counts = None if out.black_box is None else out.black_box.counts
    if not bootstrap and simulator and design.attack == "inquery" and rates is not None and counts:
        tp, fn, fp, tn = counts
        black = rate_tests(tp, tp + fn, fp, fp + tn, rates)
    if bootstrap:
        white += _noise_check_test(out.noise_check)
    white += _noise_tests(design, rows, claims, simulator)
    # A real run's (not a bootstrap's clean rows): the released labels' order, model-free, and
    # the response fields (tested here, read into the result once the verdicts stand).
    answers = None if bootstrap else released_answers(rows, "label")
    found = None if bootstrap else _response_fields(rows)
    out = finish_conformance(out, claims, black, white, answers=answers, seed=seed)
    if found is None:
        return out
    out = out.updated(response_fields=found)
    bb = out.black_box
    if found["status"] == "violation" and bb is not None and bb.verdict is not None:
        flagged = Verdict(Status.VIOLATION, str(found["message"]), violation=True)
        out = out.updated(black_box=bb.updated(verdict=flagged))
    return out


def _response_fields(rows: Sequence[TrialRecord]) -> Dependence | None:
    """The dependence test of the fields the trials logged beside their labels."""
    return dependence_test(
        [
            (r.world, str(r.observation.get("label")), json_object(r.observation.get("fields")))
            for r in rows
        ]
    )


def _noise_tests(
    design: AuditDesign,
    rows: Sequence[TrialRecord],
    claims: SettingClaims,
    simulator: bool,
) -> list[ConformanceTest]:
    """The noise ``noisy - clean`` per label of the rows that logged their noisy votes, where
    the clean votes are known; else determinism alone."""
    sigma = claims.sigma
    noisy = [r for r in rows if isinstance(r.observation.get("noisy_votes"), Mapping)]
    if not noisy or sigma is None:
        return []
    labels = list(design.labels)
    try:
        values = np.array(
            [
                [json_float(json_object(r.observation["noisy_votes"])[lab]) for lab in labels]
                for r in noisy
            ]
        )
    except (KeyError, TypeError, ValueError):
        return []
    clean = _clean_votes(design, noisy, labels, simulator, claims.own(GaussianFacts).partitions)
    if clean is None:
        return determinism_test(values)
    return residual_tests(values - clean, sigma, groups=[r.context_id for r in noisy], names=labels)


def _noise_check_test(check: JsonMapping | None) -> list[ConformanceTest]:
    """A noise check that found less noise than claimed, as a (decided) conformance test."""
    if not check or check.get("status") != "smaller":
        return []
    return [
        ConformanceTest(
            "noise scale",
            "noise_check",
            0.0,
            json_float(check.get("sigma_upper") or 0.0),
            json_int(check.get("n_residuals") or check.get("df") or 0),
            str(check.get("message")),
        )
    ]


def _clean_votes(
    design: AuditDesign,
    rows: Sequence[TrialRecord],
    labels: list[str],
    simulator: bool,
    partitions: int,
) -> np.ndarray | None:
    """Each row's clean votes: logged (``internal``), else the design's on the simulator."""
    if all(isinstance(r.observation.get("clean_votes"), Mapping) for r in rows):
        return np.array([design.clean_vector(r.observation["clean_votes"]) for r in rows])
    if not simulator or design.attack != "inquery" or len(labels) != 2 or partitions < 1:
        return None
    with_v, without_v = design_votes(design, partitions)
    return np.array([with_v if r.world == 1 else without_v for r in rows], dtype=np.float64)


def estimate_sequence(s: SettingRows, calls_per_query: int) -> SettingResult:
    """One setting's RDP estimates (paper 003); there is no bootstrap of a sequence."""
    if s.bootstrap:
        raise InvalidPlan("paper 003's adversaries are audited with `run`, not bootstrap")
    design: RdpDesign = s.design
    n1 = sum(1 for r in s.rows if r.world == 1)
    return SettingResult.of(
        **s.claims.to_json()
        | {
            "trials": len(s.rows),
            "n_with": n1,
            "n_without": len(s.rows) - n1,
            "llm_calls": len(s.rows) * calls_per_query,
            "black_box": None,
            "white_box": None,
            "rdp": estimate_rdp(s.plan, design, s.rows, s.claims),
        }
    )
