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

__all__ = ["STATUS_ORDER", "rdp_verdict", "verdict", "worst_status"]

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


def rdp_verdict(orders: Any, rdp: dict[str, Any]) -> dict[str, Any]:
    """Verdict of a Renyi-DP audit (paper 003): ``violation`` when a composed lower bound
    from the released labels (2-cut or k-cut) exceeds the Gaussian theory at some order,
    ``bug`` when it exceeds the exact divergence of the clean histograms, else ``ok``."""
    worst: tuple[float, str, float, float] | None = None
    exact_hit: tuple[str, float, float, float] | None = None
    theory, exact = rdp.get("theory"), rdp.get("exact")
    for key in ("two_cut", "k_cut"):
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
        return {
            "status": "violation",
            "violation": True,
            "exceeds_exact": exact_hit is not None,
            "message": f"PRIVACY VIOLATION: the {key} RDP audit proves D_{a:g} >= {lo:.4g} "
            f"at its confidence, above the Gaussian theory {float(theory[i]):.4g}",  # type: ignore[index]
        }
    if exact_hit is not None:
        key, a, lo, ex = exact_hit
        return {
            "status": "bug",
            "violation": False,
            "exceeds_exact": True,
            "message": f"the {key} RDP audit D_{a:g} >= {lo:.4g} exceeds the exact divergence "
            f"{ex:.4g} of the clean histograms: the server or the auditor has a bug",
        }
    return {
        "status": "ok",
        "violation": False,
        "exceeds_exact": False if exact is not None else None,
        "message": "the RDP audit stays below the Gaussian theory",
    }
