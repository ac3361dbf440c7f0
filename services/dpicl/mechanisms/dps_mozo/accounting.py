"""DPS-MOZO's own accountant and its cost event: the epsilon of n answers of T_max tokens,
proven (:mod:`.proven`) or the paper's nominal RDP (:mod:`.calibration`)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from dpicl.mechanisms.dps_mozo.calibration import mozo_epsilon
from dpicl.mechanisms.dps_mozo.proven import proven_epsilon
from dpicl.privacy.ledger import Cost


def guarantee_of(mechanism: Mapping[str, Any]) -> str:
    """``"proven"`` or ``"paper"``; contexts stored before the proven mode existed are
    paper-mode contexts."""
    return str(mechanism.get("guarantee", "paper"))


def mozo_spent_epsilon(mechanism: Mapping[str, Any], queries: int) -> float:
    """(epsilon, delta)-DP epsilon of ``queries`` DPS-MOZO answers of T_max tokens each.

    Every answer is charged its full T_max tokens whatever it generated (stopping early is a
    function of the released tokens), so after all ``mechanism["queries"]`` answers this is
    at most the configured epsilon. Proven mode: the exact optimal composition of the
    amplified per-token pure DP (:mod:`dpicl.mechanisms.dps_mozo.proven`). Paper mode
    (nominal): the conversion takes the best order up to alpha.
    """
    tokens = queries * int(mechanism["max_tokens"])
    if guarantee_of(mechanism) == "proven":
        return proven_epsilon(
            float(mechanism["max_log_ratio"]),
            int(mechanism["n_shots"]),
            float(mechanism["sample_rate"]),
            tokens,
            float(mechanism["delta"]),
        )
    return mozo_epsilon(
        float(mechanism["beta"]),
        int(mechanism["alpha"]),
        tokens,
        float(mechanism["sample_rate"]),
        float(mechanism["delta"]),
        optimize_order=True,
    )


def mozo_cost(mechanism: Mapping[str, Any]) -> Cost:
    """One answer's cost event: budgeted in queries (max_queries) by the mechanism's own
    curve, not in mu^2. One answer alone is worth T_max tokens. The proven mode's epsilon is
    the exact optimal composition of its per-token bound; the paper's is nominal, with no
    exact value."""
    one = mozo_spent_epsilon(mechanism, 1)
    return Cost(
        epsilon=one,
        delta=float(mechanism["delta"]),
        epsilon_exact=one if guarantee_of(mechanism) == "proven" else None,
        mu2=0.0,
        epsilon_total=float(mechanism["epsilon"]),
        curve=partial(mozo_spent_epsilon, dict(mechanism)),
    )
