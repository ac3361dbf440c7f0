"""Verdicts: what an estimate's lower bound says about the server's claims.

One place decides the words of every verdict, so that new audit designs (and the
INCONCLUSIVE verdict of an audit that could not have seen a violation) extend it here:

* ``violation``: epsilon_emp exceeds epsilon_theory (the claim is broken);
* ``bug``: epsilon_emp exceeds epsilon_exact, the mechanism's true epsilon at the noise the
  server reports (the server or the auditor is wrong);
* ``ok``: neither; for a *nominal* claim (DPS-MOZO's, whose per-token bound is false) the
  message says that staying below it confirms nothing.

:func:`verdict` returns the dict stored under ``"verdict"`` in every estimate.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STATUS_ORDER", "verdict", "worst_status"]

_TOL = 1e-9
#: Severity of a status, for the worst status of a run.
STATUS_ORDER = {"violation": 3, "bug": 2, "ok": 1, "error": 0, "": 0}


def verdict(
    epsilon_lower: float,
    epsilon_theory: float,
    epsilon_exact: float | None,
    *,
    nominal: bool = False,
) -> dict[str, Any]:
    """Compare a lower bound (already at the audit's confidence) with the claims."""
    exceeds_theory = epsilon_lower > epsilon_theory * (1 + _TOL) + _TOL
    exceeds_exact = epsilon_exact is not None and epsilon_lower > epsilon_exact + 1e-6
    claimed = (
        f"the configured (nominal) epsilon {epsilon_theory:g}"
        if nominal
        else (f"the claimed epsilon {epsilon_theory:g}")
    )
    if exceeds_theory:
        status = "violation"
        message = (
            f"PRIVACY VIOLATION: the audit proves epsilon >= {epsilon_lower:.3f} at its "
            f"confidence, above {claimed}"
        )
    elif exceeds_exact:
        status = "bug"
        message = (
            f"epsilon_emp {epsilon_lower:.3f} exceeds the mechanism's exact epsilon "
            f"{epsilon_exact:.3f}: the server or the auditor has a bug"
        )
    elif nominal:
        status = "ok"
        message = (
            f"measured leakage (epsilon >= {epsilon_lower:.3f}) stays within {claimed}; this "
            "cannot confirm the claim, whose per-token bound (Theorem B.3) is false"
        )
    else:
        status, message = "ok", "consistent with the claimed privacy"
    return {
        "status": status,
        "violation": exceeds_theory,
        "exceeds_exact": None if nominal and epsilon_exact is None else exceeds_exact,
        "message": message,
    }


def worst_status(statuses: list[str]) -> str:
    """violation > bug > ok > error; "error" when there is nothing."""
    worst = max(statuses, key=lambda s: STATUS_ORDER.get(s, 0), default="")
    return worst or "error"
