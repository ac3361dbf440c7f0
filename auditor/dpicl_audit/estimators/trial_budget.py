"""Real trials under a time budget, spent where they can prove something.

A real-model audit costs seconds per trial, so a time-boxed run (``make demo``) cannot give
every epsilon setting the trials its verdict needs. The verdicts' own power model says how
many it needs (:func:`~dpicl_audit.estimators.figure_power.trials_for_power_of`): below that count a
figure's verdict is INCONCLUSIVE for want of trials, whatever the server does.

* :func:`needs_from_bootstrap` reads those counts off a bootstrap. A bootstrap runs the
  same design on the same clean signals as the real trials that follow it, so its setting
  (release rates, flip rate, exact epsilon) gives the real figures' power model; the
  figures' own structure (confidences, the held-out share) comes from the plan.
* :func:`trials_from_bootstrap` turns them into one run's trials per epsilon
  (``dpicl-audit run --trials-from BOOTSTRAP``).
* :func:`plan_trials` gives every setting a minimum (each run shows the real pipeline, and
  an INCONCLUSIVE verdict that names its need), then the rest of the budget to the settings
  whose need fits, the cheapest first, shared in proportion to their needs.

Pure functions over numbers; the caller measures the time per trial.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.family import FigureRecord
from dpicl_audit.estimators.figure_power import trials_for_power_of
from dpicl_audit.estimators.whitebox import figure_test_confidences

__all__ = [
    "POWER_MARGIN",
    "needs_from_bootstrap",
    "plan_trials",
    "planned_needs",
    "trials_from_bootstrap",
]

#: Factor on the modelled need. The count is "about" (expected counts, rounded, up to 10%
#: either way), and a real run draws its worlds at random rather than evenly: a split of
#: 113 against 100 needs more trials than 107 against 106 for the same bound.
POWER_MARGIN = 1.15

#: Counts per world of the modelled real figures; only their proportions matter.
_SCALE = 100_000


def needs_from_bootstrap(
    settings: Sequence[Mapping[str, Any]],
    *,
    confidence: float,
    split: float,
    margin: float = POWER_MARGIN,
) -> dict[float, int | None]:
    """Per ``epsilon_theory`` of a bootstrap's ``settings`` (its results' list): about how
    many real white-box trials (both worlds together) a run of the same plan (its
    ``confidence``, and ``split``, the share of trials that choose the white-box threshold)
    needs before both its figures have power, times ``margin``. ``None``: no count does, or
    the bootstrap's black-box figure carries no counts.

    A real white-box run reports two figures of the same trials (estimators.whitebox): the
    black-box rule at the plan's confidence, and the white-box figure, the better of the
    black-box rule and a held-out threshold (on the ``1 - split`` of the trials the
    selection leaves), each at its share of a stricter error. Each is modelled here with the
    bootstrap's design (release rates, flip rate, exact epsilon) at those confidences and
    shares, and the larger need counts. The white-box figure's stricter confidence is what
    makes it need more: on SmolLM2 at epsilon 8, about 280 trials against the black-box
    figure's 170.
    """

    if not margin >= 1.0:
        raise InvalidAuditInput(f"margin must be >= 1, got {margin!r}")
    if not 0.0 < split < 1.0:
        raise InvalidAuditInput(f"split must lie strictly between 0 and 1, got {split!r}")
    c_black, c_held = figure_test_confidences(confidence)
    held = round(_SCALE * (1.0 - split))
    figures: tuple[FigureRecord, ...] = (
        {"n_pos": _SCALE, "n_neg": _SCALE, "confidence": confidence},
        {
            "chosen": "black_box",
            "n_pos": _SCALE,
            "n_neg": _SCALE,
            "black_box": {"n_pos": _SCALE, "n_neg": _SCALE, "confidence": c_black},
            "held_out": {"n_pos": held, "n_neg": held, "confidence": c_held},
        },
    )
    out: dict[float, int | None] = {}
    for setting in settings:
        eps = float(setting["epsilon_theory"])
        boot = setting.get("black_box") or {}
        if not boot.get("n_pos") or not boot.get("n_neg"):
            out[eps] = None
            continue
        claims = SettingClaims.from_json(setting)
        needs = [trials_for_power_of(figure, claims) for figure in figures]
        out[eps] = (
            None
            if any(n is None for n in needs)
            else math.ceil(margin * max(sum(n) for n in needs if n is not None))
        )
    return out


def plan_trials(
    needs: Mapping[float, int | None], budget: int, *, minimum: int, maximum: int
) -> dict[float, int]:
    """Real trials per setting, about ``budget`` in all (module doc).

    Every setting gets ``minimum``, even past the budget. Settings whose need is at most
    ``maximum`` and fits what is left, the smallest need first, get their need; the rest is
    shared among them in proportion to their needs, none past ``maximum``. When no need
    fits, the rest goes to the setting closest to power (the smallest need; without any
    known need, the largest epsilon): its verdict still says what it lacked, from the most
    trials the budget allows.
    """
    if not needs:
        raise InvalidAuditInput("no settings to plan trials for")
    if minimum < 1 or maximum < minimum:
        raise InvalidAuditInput(f"need 1 <= minimum <= maximum, got {minimum} and {maximum}")
    if budget < 0:
        raise InvalidAuditInput(f"budget must be >= 0 trials, got {budget}")
    for eps, need in needs.items():
        if need is not None and need < 1:
            raise InvalidAuditInput(f"the need of epsilon {eps:g} must be >= 1, got {need}")
    alloc = dict.fromkeys(needs, minimum)
    left = budget - minimum * len(needs)
    if left <= 0:
        return alloc
    known = sorted((n, eps) for eps, n in needs.items() if n is not None)
    chosen = []
    for need, eps in known:
        extra = max(0, need - minimum)
        if need <= maximum and extra <= left:
            alloc[eps] += extra
            left -= extra
            chosen.append(eps)
    if not chosen:
        closest = known[0][1] if known else max(needs)
        alloc[closest] = min(maximum, minimum + left)
        return alloc
    weight = sum(alloc[eps] for eps in chosen)
    for eps in chosen:
        alloc[eps] = min(maximum, alloc[eps] + left * alloc[eps] // weight)
    return alloc


def planned_needs(results: Mapping[str, Any]) -> dict[float, int | None]:
    """A bootstrap's ``real_trials_for_power`` per ``epsilon_theory`` (set by
    :func:`~dpicl_audit.pipeline.estimation.estimate_run` from :func:`needs_from_bootstrap`)."""
    return {float(s["epsilon_theory"]): s.get("real_trials_for_power") for s in results["settings"]}


def trials_from_bootstrap(
    results: Mapping[str, Any],
    *,
    mechanism: str,
    epsilons: Sequence[float],
    confidence: float,
    split: float,
) -> int:
    """Trials per epsilon for a real run of a plan (its ``mechanism``, ``epsilons``,
    ``confidence`` and white-box ``split``) from a bootstrap's ``results``: the largest of
    the bootstrap's ``real_trials_for_power`` over those epsilons, so that each has power.
    The bootstrap must be of the same mechanism, at the same confidence and split (its
    need was modelled at them), and have every epsilon."""
    run = results.get("run_id")
    if results.get("kind") != "bootstrap":
        raise InvalidAuditInput(f"run {run!r} is a {results.get('kind')!r} run, not a bootstrap")
    if results.get("mechanism") != mechanism:
        raise InvalidAuditInput(
            f"the bootstrap {run!r} audited {results.get('mechanism')!r}, not {mechanism!r}"
        )
    boot_split = (results.get("plan") or {}).get("split", split)
    for name, theirs, ours in (
        ("confidence", results.get("confidence"), confidence),
        ("split", boot_split, split),
    ):
        if theirs is None or not math.isclose(float(theirs), ours):
            raise InvalidAuditInput(
                f"the bootstrap {run!r} planned at {name} {theirs}, this run asks {ours}"
            )
    needs = planned_needs(results)
    counts = []
    for eps in epsilons:
        if eps not in needs:
            have = ", ".join(f"{e:g}" for e in needs)
            raise InvalidAuditInput(f"the bootstrap {run!r} has no epsilon {eps:g} (it has {have})")
        need = needs[eps]
        if need is None:
            raise InvalidAuditInput(
                f"the bootstrap {run!r} found no count of real trials that gives epsilon {eps:g} "
                "power under this design (no signal, or none in reach): change the design"
            )
        counts.append(int(need))
    return max(counts)
