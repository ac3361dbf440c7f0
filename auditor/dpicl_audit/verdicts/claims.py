"""The claims a bound may state: :func:`verdict` (a lower bound on epsilon against the claim
and the exact value), :func:`gaussian_verdict` (voting, ESA: the rules of
:mod:`~dpicl_audit.estimators.verdict_rules`), :func:`rdp_verdict` (paper 003's RDP audit),
and a VIOLATION or BUG as the run may state it for its tests together
(:func:`for_the_family`, :func:`claim_for_the_family`). Each returns a
:class:`~dpicl_audit.verdicts.model.Verdict`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from dpicl_audit.claims import SettingClaims
from dpicl_audit.estimators.family import FigureRecord, family_wise_figures, figure_record
from dpicl_audit.estimators.figure_power import exact_mus, reach_model
from dpicl_audit.estimators.gdp import gdp_mu
from dpicl_audit.estimators.power import trials_for_power
from dpicl_audit.estimators.verdict_rules import ClaimKind, VerdictResult, decide_verdict
from dpicl_audit.verdicts.model import Family, GaussianVerdict, Status, Verdict

if TYPE_CHECKING:
    from dpicl_audit.estimators.family import FamilyWise
    from dpicl_audit.estimators.verdict_rules import VerdictResult

__all__ = [
    "CALIBRATION_TOL",
    "RDP_CUTS",
    "Figures",
    "calibration_departure",
    "claim_for_the_family",
    "family_of",
    "for_the_family",
    "gaussian_verdict",
    "rdp_verdict",
    "verdict",
]

_TOL = 1e-9
#: The composed lower bounds an RDP audit (paper 003) states its claims from.
RDP_CUTS = ("two_cut", "k_cut")


class Figures(Protocol):
    """An estimate as the claims read it (:class:`dpicl_audit.results.Estimate`, which the
    mechanisms build; its package lies above this one): its stored keys and values."""

    def figure_record(self) -> FigureRecord: ...


def _figures(est: Figures | FigureRecord) -> FigureRecord:
    return figure_record(est) if isinstance(est, Mapping) else est.figure_record()


class _DesignReference(TypedDict, total=False):
    """The design's own exact epsilon, and its mu, as the BUG rule reads them
    (:func:`~dpicl_audit.estimators.verdict_rules.decide_verdict`)."""

    epsilon_exact_design: float
    mu_exact_design: float | None


class _Rules(_DesignReference):
    """What :func:`gaussian_verdict` asks of
    :func:`~dpicl_audit.estimators.verdict_rules.decide_verdict` beside the bounds."""

    claim: ClaimKind
    epsilon_theory: float
    mu_claimed: float
    epsilon_exact: float | None
    mu_exact: float | None
    flip_rate: float | None
    max_reachable: float | None


def verdict(
    epsilon_lower: float,
    epsilon_theory: float,
    epsilon_exact: float | None,
    *,
    nominal: bool = False,
) -> Verdict:
    """Compare a lower bound (already at the audit's confidence) with the claims."""
    exceeds_theory = epsilon_lower > epsilon_theory * (1 + _TOL) + _TOL
    exceeds_exact = epsilon_exact is not None and epsilon_lower > epsilon_exact + 1e-6
    claimed = (
        f"the configured (nominal) epsilon {epsilon_theory:g}"
        if nominal
        else (f"the claimed epsilon {epsilon_theory:g}")
    )
    if exceeds_theory:
        status = Status.VIOLATION
        message = (
            f"PRIVACY VIOLATION: the audit proves epsilon >= {epsilon_lower:.3f} at its "
            f"confidence, above {claimed}"
        )
    elif exceeds_exact:
        status = Status.BUG
        message = (
            f"epsilon_emp {epsilon_lower:.3f} exceeds the mechanism's exact epsilon "
            f"{epsilon_exact:.3f}: the server or the auditor has a bug"
        )
    elif nominal:
        status = Status.OK
        message = (
            f"measured leakage (epsilon >= {epsilon_lower:.3f}) stays within {claimed}; this "
            "cannot confirm the claim, whose per-token bound (Theorem B.3) is false"
        )
    else:
        status, message = Status.OK, "consistent with the claimed privacy"
    return Verdict(
        status=status,
        violation=exceeds_theory,
        exceeds_exact=None if nominal and epsilon_exact is None else exceeds_exact,
        message=message,
    )


_STATUS_OF_WORD = {
    "VIOLATION": Status.VIOLATION,
    "BUG": Status.BUG,
    "INCONCLUSIVE": Status.INCONCLUSIVE,
    "CONSISTENT": Status.OK,
}


def gaussian_verdict(est: Figures | FigureRecord, claims: SettingClaims) -> GaussianVerdict:
    """Verdict of an audit of a Gaussian claim (voting, ESA) by the rules of
    :func:`~dpicl_audit.estimators.verdict_rules.decide_verdict`: VIOLATION on ``mu_lower >
    mu_claimed`` or the classical bound above epsilon_theory, BUG above the exact values,
    INCONCLUSIVE without power (with the reason and advice), else CONSISTENT.

    ``claims.family`` (its size m and confidence c, set by the run's estimation): a
    VIOLATION or BUG stands only if it holds for the run's m figures together
    (:mod:`~dpicl_audit.estimators.family`), else the figure is INCONCLUSIVE and says why."""

    est = _figures(est)
    theory, delta, exact = claims.epsilon_theory, claims.delta, claims.epsilon_exact
    mu_exact, mu_signal = exact_mus(claims)
    found = reach_model(est, claims, mu_signal)
    reach = None if found is None else found[0](*found[1])
    rules = _Rules(
        claim="gaussian",
        epsilon_theory=theory,
        mu_claimed=gdp_mu(theory, delta),
        epsilon_exact=exact,
        mu_exact=None if mu_exact is None else mu_exact * (1 + 1e-6) + 1e-9,
        flip_rate=claims.flip_rate,
        max_reachable=reach,
        **_design_reference(claims),
    )
    res = decide_verdict(
        epsilon_classical=float(est.get("epsilon_lower_classic") or 0.0),
        mu_lower=float(est.get("mu_lower") or 0.0),
        **rules,
    )
    if found is not None and res.underpowered is not None:
        model, (n_pos, n_neg) = found
        res = res.with_trials_needed(
            trials_for_power(model, res.underpowered, n_pos=n_pos, n_neg=n_neg)
        )
    family = family_of(claims)
    together = None
    if res.verdict in ("VIOLATION", "BUG") and family is not None:
        res, together = _claim_for_the_family(res, est, rules, family, delta)
    weaker = calibration_departure(claims)
    if weaker is not None and res.verdict != "VIOLATION":
        # Deterministic, beside the statistics: no trial can make a weak calibration right.
        kept = res.reasons[:1] if res.verdict == "BUG" else ()
        res = VerdictResult("BUG", (weaker, *kept))
    status = _STATUS_OF_WORD[res.verdict]
    if status is Status.OK:
        message = (
            "consistent with the claimed privacy: the audit could have reached "
            f"epsilon {reach:.3g} and found nothing above the claim"
        )
    else:
        message = f"{res.verdict}: " + "; ".join(res.reasons)
    if res.advice:
        message += " (to change: " + "; ".join(res.advice) + ")"
    return GaussianVerdict(
        status=status,
        word=res.verdict,
        violation=res.verdict == "VIOLATION",
        exceeds_exact=res.verdict == "BUG",
        message=message,
        reasons=tuple(res.reasons),
        advice=tuple(res.advice),
        max_reachable=reach,
        # [with the canary, without]: about what reaches the power the audit lacked.
        trials_needed=res.trials_needed,
        family_wise=None if together is None else together.to_dict(),
        together=True,
    )


#: Relative tolerance of the calibration check: the auditor's exact epsilon from the reported
#: sigma and the server's calibration agree to about 1e-9 (analytic calibration); the claim
#: is read as broken only above this.
CALIBRATION_TOL = 1e-4


def calibration_departure(claims: SettingClaims) -> str | None:
    """The deterministic claim check of a Gaussian setting (issue 35, item 4): the exact
    epsilon of the noise the server reports, at the design's sensitivity
    (``claims.epsilon_exact``, the auditor's own computation), and the exact epsilon the
    server itself reports (``claims.epsilon_exact_server``) must not exceed the claimed
    epsilon. Either above it is a BUG whatever the trials say: the mechanism as reported is
    weaker than its claim. Returns the reason, or None where the calibration meets the claim
    (or nothing was reported)."""

    theory = claims.epsilon_theory
    limit = theory * (1 + CALIBRATION_TOL) + 1e-9
    sigma, sens = claims.sigma, claims.sensitivity
    for found, who in (
        (claims.epsilon_exact, "the auditor's"),
        (claims.epsilon_exact_server, "the server's"),
    ):
        if found is None or float(found) <= limit:
            continue
        noise = "" if sigma is None else f" (sigma {sigma:.6g}"
        if noise and sens is not None:
            noise += f", reported sensitivity {sens:.6g}"
        noise += ")" if noise else ""
        return (
            f"the reported calibration{noise} is weaker than claimed: {who} exact epsilon "
            f"{float(found):.4g} of that noise at the design's sensitivity exceeds the claimed "
            f"epsilon {theory:g} (a deterministic check, not a statistical one)"
        )
    return None


def _design_reference(claims: SettingClaims) -> _DesignReference:
    """The design's own exact epsilon (``claims.epsilon_exact_design``, below the worst
    case; with its mu where it is a Gaussian mechanism's), for the BUG rule."""

    own = claims.epsilon_exact_design
    if own is None:
        return _DesignReference()
    mu = gdp_mu(own, claims.delta) if claims.epsilon_exact_design_gaussian else None
    return _DesignReference(
        epsilon_exact_design=own, mu_exact_design=None if mu is None else mu * (1 + 1e-6) + 1e-9
    )


def _claim_for_the_family(
    res: VerdictResult,
    est: FigureRecord,
    rules: _Rules,
    family: Family,
    delta: float,
) -> tuple[VerdictResult, FamilyWise | None]:
    """A figure's VIOLATION or BUG as the run may state it: only where it still holds with
    every test's error divided by the run's ``size`` figures (estimators.family), so that
    all of a run's claims hold together at its confidence; else INCONCLUSIVE, saying so."""

    size, conf = family.size, family.confidence
    together = family_wise_figures(est, size, delta)
    if together is not None:
        again = decide_verdict(
            epsilon_classical=together.epsilon_lower_classic,
            mu_lower=together.mu_lower,
            **rules,
        )
        shown = _shown(together)
        if again.verdict in ("VIOLATION", "BUG"):
            held = _held_together(size, conf, shown)
            return VerdictResult(again.verdict, (*again.reasons, held)), together
    else:
        shown = "its tests' counts are not in the estimate"
    reason = _alone_not_together(res.verdict, "; ".join(res.reasons), size, conf, shown)
    return VerdictResult("INCONCLUSIVE", (reason,), (_AGAIN,)), together


_AGAIN = "run it again with more trials to tell"


def _shown(figures: FamilyWise) -> str:
    return f"mu_lower {figures.mu_lower:.4g}, classical bound {figures.epsilon_lower_classic:.4g}"


def _alone_not_together(word: str, why: str, size: int, conf: float, shown: str) -> str:
    return (
        f"this figure alone reads {word} at {conf:.0%} ({why}), but not the run's {size} "
        f"tests together ({shown}): a correct server shows such a figure in up to "
        f"{min(1.0, size * (1 - conf)):.0%} of runs"
    )


def _held_together(size: int, conf: float, shown: str) -> str:
    return (
        f"this holds for the run's {size} tests together at {conf:.0%} (each test's error "
        f"divided by {size}: {shown})"
    )


def claim_for_the_family(
    alone: Verdict,
    together: Verdict | None,
    family: Family,
    shown: str,
) -> Verdict:
    """A :func:`verdict` or :func:`rdp_verdict`'s VIOLATION or BUG as the run may state it
    (estimators.family): ``together``, the same verdict with every test behind it at error
    ``(1 - c) / size``, where that still flags (saying so); else INCONCLUSIVE, saying why.
    ``shown`` names the stricter figures; ``together`` None: they could not be had."""
    size, conf = family.size, family.confidence
    if together is not None and together.flags:
        return replace(together, message=f"{together.message}; {_held_together(size, conf, shown)}")
    word = {Status.VIOLATION: "VIOLATION", Status.BUG: "BUG"}[alone.status]
    return Verdict(
        status=Status.INCONCLUSIVE,
        violation=False,
        exceeds_exact=False,
        message=f"INCONCLUSIVE: {_alone_not_together(word, alone.message, size, conf, shown)}"
        f" (to change: {_AGAIN})",
    )


def family_of(claims: SettingClaims) -> Family | None:
    """The run's family (``claims.family``, set by estimation.estimate_run) where it has
    more than one test, else None: a lone test's claim needs no correction."""
    family = claims.family
    return None if family is None or family.size <= 1 else family


def for_the_family(
    alone: Verdict,
    est: Figures | FigureRecord,
    claims: SettingClaims,
    judge: Callable[[FamilyWise], Verdict],
) -> Verdict:
    """``alone`` (a :func:`verdict` of the estimate ``est``, from its counts) as the run may
    state it: a VIOLATION or BUG is judged again by ``judge`` on the estimate's figures with
    each test at error ``(1 - c) / size`` (:func:`claim_for_the_family`)."""

    family = family_of(claims)
    if family is None or not alone.flags:
        return alone
    figures = family_wise_figures(_figures(est), family.size, claims.delta)
    if figures is None:
        together, shown = None, "its tests' counts are not in the estimate"
    else:
        together, shown = judge(figures), _shown(figures)
    out = claim_for_the_family(alone, together, family, shown)
    return replace(out, family_wise=None if figures is None else figures.to_dict(), together=True)


def rdp_verdict(orders: Any, rdp: Mapping[str, Any]) -> Verdict:
    """Verdict of a Renyi-DP audit (paper 003): ``violation`` when a composed lower bound
    from the released labels (2-cut or k-cut) exceeds the Gaussian theory at some order,
    ``bug`` when it exceeds the exact divergence of the clean histograms, else ``ok``."""
    worst: tuple[float, str, float, float] | None = None
    exact_hit: tuple[str, float, float, float] | None = None
    theory, exact = rdp.get("theory"), rdp.get("exact")
    for key in RDP_CUTS:
        lower = rdp.get(key)
        if lower is None:
            continue
        for i, a in enumerate(orders):
            lo = float(lower[i])
            over = theory is not None and lo > float(theory[i]) * (1 + _TOL) + _TOL
            if over and (worst is None or lo / float(theory[i]) > worst[0]):  # type: ignore[index]
                worst = (lo / float(theory[i]), key, float(a), lo)  # type: ignore[index]
            if exact is not None and lo > float(exact[i]) + 1e-6 and exact_hit is None:
                exact_hit = (key, float(a), lo, float(exact[i]))
    if worst is not None:
        _, key, a, lo = worst
        i = list(map(float, orders)).index(a)
        return Verdict(
            status=Status.VIOLATION,
            violation=True,
            exceeds_exact=exact_hit is not None,
            message=f"PRIVACY VIOLATION: the {key} RDP audit proves D_{a:g} >= {lo:.4g} "
            f"at its confidence, above the Gaussian theory {float(theory[i]):.4g}",  # type: ignore[index]
        )
    if exact_hit is not None:
        key, a, lo, ex = exact_hit
        return Verdict(
            status=Status.BUG,
            violation=False,
            exceeds_exact=True,
            message=f"the {key} RDP audit D_{a:g} >= {lo:.4g} exceeds the exact divergence "
            f"{ex:.4g} of the clean histograms: the server or the auditor has a bug",
        )
    return Verdict(
        status=Status.OK,
        violation=False,
        exceeds_exact=False if exact is not None else None,
        message="the RDP audit stays below the Gaussian theory",
    )
