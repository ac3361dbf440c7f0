"""The white-box findings of a DPS-MOZO audit: the per-token claims checked over all logged
trials (not epsilon estimates; direct checks of the premises the claimed epsilon rests on).

* :func:`ratio_check`, proven mode: the auditor's own per-token figures
  (:func:`dpicl_audit.mechanisms.dps_mozo.check.token_check`, logged with each trial) against
  ``max_log_ratio`` and ``per_token_epsilon``, and the first token's released distributions
  of C1 and C0 answers drawn with the same shot set against ``per_token_epsilon``; a token
  outside a bound is a VIOLATION naming the trial(s), world and token.
* :func:`divergence_check`, paper mode: the exact per-shot Renyi divergences the server
  reports against the claimed per-token bound ``4 beta alpha`` (Theorem B.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dpicl_audit.jsontypes import JsonObject, json_float, json_list, json_object
from dpicl_audit.mechanisms.dps_mozo.check import exceeds, neighbour_gap
from dpicl_audit.mechanisms.dps_mozo.facts import MozoFacts
from dpicl_audit.results import Estimate
from dpicl_audit.store import TrialRecord
from dpicl_audit.verdicts import Status, Verdict

__all__ = ["divergence_check", "ratio_check", "without_signal"]


_NO_INTERNALS = "no per-token internals logged (white-box needs /v1/debug/generate)"


def _max_divergence(rows: Sequence[TrialRecord], key: str) -> float | None:
    values = [
        json_float(v)
        for r in rows
        for tok in json_list(r.observation.get("tokens"))
        for pair in json_list(json_object(tok).get(key))
        for v in json_list(pair)
    ]
    return max(values) if values else None


def divergence_check(rows: Sequence[TrialRecord], facts: MozoFacts) -> Estimate:
    """The white-box observation's finding: per-token divergences against the claimed
    per-token bound. Not an epsilon estimate; a direct check of Theorem B.3's premise."""
    if not rows or any("tokens" not in r.observation for r in rows):
        return Estimate.of(error=_NO_INTERNALS)
    bound = facts.per_token_bound
    reached = _max_divergence(rows, "divergences")
    exact = _max_divergence(rows, "exact_divergences")
    out: JsonObject = {
        "kind": "divergence",
        "trials": len(rows),
        "tokens": sum(len(json_list(r.observation.get("tokens"))) for r in rows),
        "max_divergence_reached": reached,
        "max_exact_divergence": exact,
        "per_token_bound": bound,
    }
    if exact is None or bound is None:
        unchecked = Verdict(
            status=Status.OK,
            violation=False,
            message="no exact per-token divergences (the server is not at internal)",
        )
        return Estimate.of(**out, verdict=unchecked)
    broken = exact > float(bound) * (1 + 1e-9)
    found = Verdict(
        status=Status.VIOLATION if broken else Status.OK,
        violation=broken,
        message=(
            f"PER-TOKEN CLAIM BROKEN: an exact per-shot divergence {exact:.3f} of a released "
            f"distribution exceeds the claimed per-token bound 4*beta*alpha = {bound:.3f}"
            if broken
            else f"every exact per-shot divergence (max {exact:.3f}) is within the claimed "
            f"per-token bound {float(bound):.3f}"
        ),
    )
    return Estimate.of(**out, verdict=found)


#: Largest |log| gap between the reported product_probs and the product of the reported
#: mixed_probs that rounding explains (both come from float64 softmaxes of the same logits).
_PRODUCT_TOL = 1e-6


def _worst(
    rows: Sequence[TrialRecord], key: str
) -> tuple[float | None, tuple[int, int, int] | None]:
    """The largest per-token figure ``key`` over the rows, with (trial, world, token)."""
    best: tuple[float | None, tuple[int, int, int] | None] = (None, None)
    for r in rows:
        for t, tok in enumerate(json_list(r.observation.get("tokens"))):
            v = json_object(tok).get(key)
            if v is not None and (best[0] is None or json_float(v) > best[0]):
                best = (json_float(v), (r.trial_index, r.world, t))
    return best


def _where(at: tuple[int, int, int] | None) -> str:
    return "" if at is None else f" (trial {at[0]}, C{at[1]}, token {at[2]})"


def _neighbour_pairs(
    rows: Sequence[TrialRecord],
) -> tuple[int, float | None, tuple[int, int] | None]:
    """Shot sets seen in both worlds at the first token, and the largest
    ``max_y |log P_C1 - log P_C0|`` over them, with the two trials compared."""
    first: dict[tuple[Any, ...], dict[int, TrialRecord]] = {}
    for r in rows:
        f = json_object(r.observation.get("first_token"))
        if f:
            key = (tuple(json_list(f["shots"])), tuple(json_list(f.get("top_ids"))))
            first.setdefault(key, {}).setdefault(r.world, r)
    pairs, worst, where = 0, None, None
    for by_world in first.values():
        if 1 in by_world and 0 in by_world:
            r1, r0 = by_world[1], by_world[0]
            gap = neighbour_gap(_first_probs(r1), _first_probs(r0))
            pairs += 1
            if worst is None or gap > worst:
                worst, where = gap, (r1.trial_index, r0.trial_index)
    return pairs, worst, where


def _first_probs(r: TrialRecord) -> list[float]:
    """The trial's first-token ``product_probs`` (logged at ``internal``)."""
    first = json_object(r.observation["first_token"])
    return [json_float(p) for p in json_list(first["product_probs"])]


def ratio_check(rows: Sequence[TrialRecord], facts: MozoFacts) -> Estimate:
    """The proven mode's white-box finding, token by token: the auditor's own radius within
    max_log_ratio, and the realised worst case (its own and the server's exact_log_ratios)
    within per_token_epsilon. Not an epsilon estimate: a direct check of the claim's premise.
    """
    if not rows or any("tokens" not in r.observation for r in rows):
        return Estimate.of(error=_NO_INTERNALS)
    eps0, per_token = facts.max_log_ratio, facts.per_token_epsilon
    if eps0 is None or per_token is None:  # setting_claims refuses such a proven context
        return Estimate.of(error="the contexts report no max_log_ratio/per_token_epsilon")
    radius, radius_at = _worst(rows, "radius")
    exact, exact_at = _worst(rows, "exact")
    exact_srv, exact_srv_at = _worst(rows, "exact_server")
    gap, gap_at = _worst(rows, "product_gap")
    pairs, neighbour, neighbour_at = _neighbour_pairs(rows)
    out: JsonObject = {
        "kind": "max-log-ratio",
        "trials": len(rows),
        "tokens": sum(len(json_list(r.observation.get("tokens"))) for r in rows),
        "max_log_ratio": eps0,
        "per_token_epsilon": per_token,
        "max_radius": radius,
        "max_exact_log_ratio": exact,
        "max_exact_log_ratio_server": exact_srv,
        "max_radius_server": _worst(rows, "radius_server")[0],
        "max_product_gap": gap,
        "neighbour_shot_sets": pairs,
        "max_neighbour_log_ratio": neighbour,
        "per_token_bound": per_token,
    }
    unchecked = sum(
        json_object(tok).get("radius") is None
        for r in rows
        for tok in json_list(r.observation.get("tokens"))
    )
    broken = []
    if exceeds(radius, eps0):
        broken.append(
            f"a mixed distribution lies {radius:.4g} from the zero-shot one{_where(radius_at)}, "
            f"above max_log_ratio {eps0:.4g}"
        )
    for value, at, whose in (
        (exact, exact_at, "recomputed"),
        (exact_srv, exact_srv_at, "reported"),
    ):
        if exceeds(value, per_token):
            broken.append(
                f"the {whose} worst-case |log P/P'| {value:.4g}{_where(at)} exceeds "
                f"per_token_epsilon {per_token:.4g}"
            )
    if exceeds(neighbour, per_token) and neighbour_at is not None:
        broken.append(
            f"the first token's released distributions of C1 (trial {neighbour_at[0]}) and C0 "
            f"(trial {neighbour_at[1]}) with the same shots differ by {neighbour:.4g} in log, "
            f"above per_token_epsilon {per_token:.4g}"
        )
    if broken:
        status, message = Status.VIOLATION, "PRIVACY VIOLATION: " + "; ".join(broken)
    elif gap is not None and gap > _PRODUCT_TOL:
        status = Status.BUG
        message = (
            f"the reported product_probs differ from the product of the reported mixed_probs by "
            f"{gap:.3g} in log{_where(gap_at)}: the internals are not what was released"
        )
    elif unchecked or radius is None or exact is None:
        status = Status.INCONCLUSIVE
        message = (
            f"{unchecked} of {out['tokens']} released tokens came without probabilities (the "
            "server is not at DPICL_WHITEBOX=internal): the auditor could not recompute the bounds"
        )
    else:
        status = Status.OK
        message = (
            f"every released token ({out['tokens']}) stays within max_log_ratio {eps0:.4g} "
            f"(max {radius:.4g}) and per_token_epsilon {per_token:.4g} (realised max "
            f"{max(exact, exact_srv or 0.0):.4g}), as recomputed by the auditor"
        )
        if neighbour is not None:
            message += (
                f"; C1 against C0 with the same shots ({pairs} shot sets): max "
                f"{neighbour:.4g} at the first token"
            )
    found = Verdict(status=status, violation=status is Status.VIOLATION, message=message)
    return Estimate.of(**out, verdict=found)


def without_signal(found: Verdict, est: Estimate) -> Verdict:
    """A verdict that is not a violation, of an attack whose decision never varied (neither
    world ever produced the signal, or both always did): INCONCLUSIVE, never "ok": the audit
    could not have seen a difference between the worlds (issue 27)."""
    if found.flags:
        return found
    tp, fn, fp, tn = (int(c or 0) for c in (est.tp, est.fn, est.fp, est.tn))
    if tp + fp and fn + tn:
        return found
    said = "never" if tp + fp == 0 else "always"
    return replace(
        found,
        status=Status.INCONCLUSIVE,
        violation=False,
        message=f"INCONCLUSIVE: the released text {said} started with the signal, in "
        f"either world ({tp + fn} trials with the canary, {fp + tn} without): the attack "
        "could not have seen a difference (to change: signal words the model answers with, "
        "a longer --max-tokens, or the white-box audit)"
        # A nominal claim keeps saying so.
        + (f"; {found.message}" if "nominal" in found.message else ""),
    )
