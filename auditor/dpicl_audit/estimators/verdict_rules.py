"""Verdict rules: what an audit's figures entitle it to say (issue 14, DESIGN.md section 5).

In order:

1. ``VIOLATION`` (the claim is broken). For a Gaussian claim (voting, ESA: the server claims
   a Gaussian mechanism, so its trade-off *is* Gaussian and the GDP figure is a fair test):
   ``mu_lower > mu_claimed``, or the classical bound exceeds ``epsilon_theory``. For any other
   claim only the classical bound counts (the GDP conversion assumes a Gaussian trade-off the
   claim does not make).
2. ``BUG``: not a violation, but a figure above the mechanism's exact value (``mu_exact`` /
   ``epsilon_exact``), or above the design's own exact value where it is lower
   (``epsilon_exact_design`` / ``mu_exact_design``: ESA's canary shift, voting's released
   label on the simulator): the server or the auditor is wrong.
3. ``INCONCLUSIVE``: the audit could not have seen a violation. Either the clean signals never
   differed between the worlds (``flip_rate == 0``), or the largest epsilon the design could
   reach with these trials (:func:`~dpicl_audit.estimators.power.max_reachable_epsilon`) is
   below ``min_power_fraction`` of the reference (``epsilon_exact`` when known, else
   ``epsilon_theory``). The result says why and what to change.
   Without a reachable bound the power is unknown, which is INCONCLUSIVE too.
4. ``CONSISTENT``: otherwise: the audit had power and found nothing above the claim.

Pure functions over numbers; the caller supplies the figures from the same trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.power import MAX_SEARCHED_TRIALS

__all__ = [
    "DEFAULT_MIN_POWER_FRACTION",
    "ClaimKind",
    "RuleWord",
    "VerdictResult",
    "decide_verdict",
]

#: The word a rule decides; :class:`dpicl_audit.verdicts.Verdict`, the one verdict type,
#: stores it under ``"verdict"`` (this module only decides).
RuleWord = Literal["VIOLATION", "BUG", "INCONCLUSIVE", "CONSISTENT"]
ClaimKind = Literal["gaussian", "other"]

DEFAULT_MIN_POWER_FRACTION = 0.5
"""An audit that could reach less than this fraction of epsilon_exact (at its expected counts)
is INCONCLUSIVE: it could only have seen a violation several times larger than the truth."""

_ADVICE_NO_SIGNAL = (
    "use a design whose canary changes the clean output: the pivotal canary (other partitions "
    "pinned so the canary's partition decides), the identical-text design on a real model, or "
    "another model that follows its demonstrations"
)
_GROWS = "(the reachable bound grows with log of the trial count)"
_ADVICE_TRIALS = f"run more trials {_GROWS}"


def _advice_trials(needed: tuple[int, int] | None, target: float) -> str:
    """The trials advice with the count the design's model asks for (estimators.power)."""
    if needed is None:
        return (
            f"more trials will not do: under the design's model even {MAX_SEARCHED_TRIALS:,} "
            f"trials in all stay below {target:.4g}; " + _ADVICE_NO_SIGNAL
        )
    pos, neg = needed
    return (
        f"run more trials: about {pos + neg:,} in all ({pos:,} with the canary, {neg:,} "
        f"without) would reach {target:.4g} under the design's model {_GROWS}"
    )


@dataclass(frozen=True)
class VerdictResult:
    """The verdict, the reasons that decided it, and advice when it is INCONCLUSIVE.

    ``underpowered``: for an INCONCLUSIVE verdict for want of trials, the bound the design
    fell short of (:meth:`with_trials_needed` then says how many trials reach it)."""

    verdict: RuleWord
    reasons: tuple[str, ...]
    advice: tuple[str, ...] = ()
    underpowered: float | None = None
    trials_needed: tuple[int, int] | None = None

    def with_trials_needed(self, needed: tuple[int, int] | None) -> VerdictResult:
        """This verdict with its trials advice naming ``needed`` (trials with and without
        the canary, :func:`~dpicl_audit.estimators.power.trials_for_power`; ``None``: no
        count reaches it)."""
        if self.underpowered is None:
            raise InvalidAuditInput("only an INCONCLUSIVE verdict for want of trials needs more")
        advice = (_advice_trials(needed, self.underpowered), *self.advice[1:])
        return replace(self, advice=advice, trials_needed=needed)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict."""
        return {"verdict": self.verdict, "reasons": list(self.reasons), "advice": list(self.advice)}


def _finite_or_none(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    v = float(value)
    if math.isnan(v):
        raise InvalidAuditInput(f"{name} must not be NaN")
    return v


def decide_verdict(
    *,
    claim: ClaimKind,
    epsilon_theory: float,
    epsilon_classical: float,
    mu_lower: float | None = None,
    mu_claimed: float | None = None,
    epsilon_exact: float | None = None,
    mu_exact: float | None = None,
    flip_rate: float | None = None,
    max_reachable: float | None = None,
    min_power_fraction: float = DEFAULT_MIN_POWER_FRACTION,
    epsilon_exact_design: float | None = None,
    mu_exact_design: float | None = None,
) -> VerdictResult:
    """Apply the rules of the module docstring.

    ``epsilon_classical``: the assumption-free bound; ``mu_lower``: the GDP bound (used only
    for a ``"gaussian"`` claim, where ``mu_claimed`` is then required). ``flip_rate``: fraction
    of trials whose clean signal differed between worlds (``None``: not measured).
    ``max_reachable``: the design's reachable epsilon at these trials (``None``: not computed).
    """
    if claim not in ("gaussian", "other"):
        raise InvalidAuditInput(f"claim must be 'gaussian' or 'other', got {claim!r}")
    theory = float(epsilon_theory)
    if not theory > 0.0:
        raise InvalidAuditInput(f"epsilon_theory must be positive, got {epsilon_theory!r}")
    classical = float(epsilon_classical)
    if math.isnan(classical) or classical < 0.0:
        raise InvalidAuditInput(f"epsilon_classical must be >= 0, got {epsilon_classical!r}")
    mu_l = _finite_or_none(mu_lower, "mu_lower")
    mu_c = _finite_or_none(mu_claimed, "mu_claimed")
    exact = _finite_or_none(epsilon_exact, "epsilon_exact")
    mu_x = _finite_or_none(mu_exact, "mu_exact")
    flips = _finite_or_none(flip_rate, "flip_rate")
    reach = _finite_or_none(max_reachable, "max_reachable")
    if flips is not None and not 0.0 <= flips <= 1.0:
        raise InvalidAuditInput(f"flip_rate must lie in [0, 1], got {flip_rate!r}")
    if not 0.0 < float(min_power_fraction) <= 1.0:
        raise InvalidAuditInput(
            f"min_power_fraction must lie in (0, 1], got {min_power_fraction!r}"
        )
    gaussian = claim == "gaussian"
    if gaussian and (mu_l is None or mu_c is None):
        raise InvalidAuditInput("a Gaussian claim needs mu_lower and mu_claimed")

    broken: list[str] = []
    if gaussian and mu_l is not None and mu_c is not None and mu_l > mu_c:
        broken.append(
            f"mu_lower = {mu_l:.4g} > mu_claimed = {mu_c:.4g}: the mechanism is not "
            f"{mu_c:.4g}-GDP, so the Gaussian claim is false"
        )
    if classical > theory:
        broken.append(
            f"classical (assumption-free) bound {classical:.4g} > epsilon_theory = {theory:.4g}"
        )
    if broken:
        return VerdictResult("VIOLATION", tuple(broken))

    bug: list[str] = []
    if exact is not None and classical > exact:
        bug.append(f"classical bound {classical:.4g} > epsilon_exact = {exact:.4g}")
    if gaussian and mu_l is not None and mu_x is not None and mu_l > mu_x:
        bug.append(f"mu_lower = {mu_l:.4g} > mu_exact = {mu_x:.4g}")
    own = _finite_or_none(epsilon_exact_design, "epsilon_exact_design")
    own_mu = _finite_or_none(mu_exact_design, "mu_exact_design")
    if own is not None and classical > own and not bug:
        bug.append(
            f"classical bound {classical:.4g} > the design's own exact epsilon {own:.4g} "
            "(the most its canary can show on a correct server)"
        )
    if gaussian and own_mu is not None and mu_l is not None and mu_l > own_mu and not bug:
        bug.append(f"mu_lower = {mu_l:.4g} > the design's own mu {own_mu:.4g}")
    if bug:
        return VerdictResult("BUG", (*bug, "the server or the auditor has a bug"))

    reference = exact if exact is not None else theory
    ref_name = "epsilon_exact" if exact is not None else "epsilon_theory"
    if flips is not None and flips == 0.0:
        return VerdictResult(
            "INCONCLUSIVE",
            (
                "the clean outputs never differed between the two worlds: no attack could see "
                "the canary, whatever the noise",
            ),
            (_ADVICE_NO_SIGNAL,),
        )
    if reach is not None and reach < min_power_fraction * reference:
        advice = [_ADVICE_TRIALS]  # first: with_trials_needed replaces it
        if flips is not None and flips < 1.0:
            advice.append(
                f"the canary changed the clean output in only {flips:.0%} of trials; "
                + _ADVICE_NO_SIGNAL
            )
        return VerdictResult(
            "INCONCLUSIVE",
            (
                f"the largest epsilon this design could reach with these trials is {reach:.4g}, "
                f"below {min_power_fraction:g} x {ref_name} = {min_power_fraction * reference:.4g}",
            ),
            tuple(advice),
            underpowered=min_power_fraction * reference,
        )
    if reach is None:
        return VerdictResult(
            "INCONCLUSIVE",
            (
                "the audit's power was not assessed (no reachable bound given): nothing says it "
                "could have seen a violation",
            ),
            ("compute max_reachable_epsilon for the design and the trials",),
        )
    reasons = [
        f"classical bound {classical:.4g} <= epsilon_theory = {theory:.4g}",
        f"the design could reach {reach:.4g} (>= {min_power_fraction:g} x {ref_name})",
    ]
    if gaussian:
        reasons.insert(0, f"mu_lower = {mu_l:.4g} <= mu_claimed = {mu_c:.4g}")
    return VerdictResult("CONSISTENT", tuple(reasons))
