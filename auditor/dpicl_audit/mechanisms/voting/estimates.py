"""Private voting's estimates of one setting: the exact epsilons beside them, the trials'
figures (or the bootstrap's, :mod:`.bootstrap`), the conformance tests (:mod:`.conformance`),
and paper 003's RDP audit of a query sequence (:mod:`.rdp_estimates`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dpicl_audit.catalog.settings import PartitionedSettings
from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.estimators.extra_fields import dependence_test
from dpicl_audit.estimators.label_release import label_release_epsilon, label_release_probabilities
from dpicl_audit.jsontypes import json_object
from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.mechanisms.trial_estimates import estimate_trials, with_verdict
from dpicl_audit.mechanisms.voting.bootstrap import estimate_voting_bootstrap
from dpicl_audit.mechanisms.voting.conformance import voting_conformance
from dpicl_audit.mechanisms.voting.design import AuditDesign, design_votes
from dpicl_audit.mechanisms.voting.rdp import RdpDesign
from dpicl_audit.mechanisms.voting.rdp_estimates import estimate_rdp
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import STREAM_ORDER
from dpicl_audit.results import SettingResult
from dpicl_audit.store import TrialRecord
from dpicl_audit.verdicts import Status, Verdict

__all__ = ["estimate_sequence", "estimate_votes", "release_claims", "release_reference"]


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
    """One setting's estimates: Algorithm 1 of paper 000 (``bootstrap``) or the trials'."""
    plan, design, k, rows, claims = s.plan, s.design, s.k, s.rows, s.claims
    bootstrap = s.bootstrap
    if bootstrap:
        out = estimate_voting_bootstrap(plan, design, k, rows, claims)
    else:
        out = estimate_trials(plan, k, rows, claims, calls_per_query=calls_per_query)
        bb = out.black_box
        ref = release_reference(
            claims,
            design.attack,
            plan.setting if PartitionedSettings.of(plan).temperature == 0 else "",
        )
        if ref is not None and bb is not None and bb.verdict is not None:
            out = out.updated(black_box=with_verdict(bb, ref))
    if bootstrap:  # the setting's own debug rows (the clean log holds every setting's)
        ids = claims.context_id_set()
        rows = [r for r in rows if r.context_id in ids]
    out = voting_conformance(
        design,
        out,
        rows,
        claims,
        temperature=PartitionedSettings.of(plan).temperature,
        bootstrap=bootstrap,
        known_votes=plan.setting == "audit-template",
        seed=[plan.seed, k, STREAM_ORDER],
    )
    return out if bootstrap else with_response_fields(out, rows)


def with_response_fields(out: SettingResult, rows: Sequence[TrialRecord]) -> SettingResult:
    """The setting with its response fields' dependence test (issue 35, item 1;
    :func:`~dpicl_audit.estimators.extra_fields.dependence_test`) under ``response_fields``,
    where any trial logged a field; a dependent field makes the black-box verdict a
    VIOLATION that names it."""
    found = dependence_test(
        [
            (r.world, str(r.observation.get("label")), json_object(r.observation.get("fields")))
            for r in rows
        ]
    )
    if found is None:
        return out
    out = out.updated(response_fields=found)
    bb = out.black_box
    if found["status"] == "violation" and bb is not None and bb.verdict is not None:
        flagged = Verdict(Status.VIOLATION, str(found["message"]), violation=True)
        out = out.updated(black_box=bb.updated(verdict=flagged))
    return out


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
