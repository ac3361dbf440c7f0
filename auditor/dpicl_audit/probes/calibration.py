"""The claim against the reported calibration, at epsilons the plan does not audit (issue 35,
item 4).

Each audited setting's figures already carry the deterministic claim check
(:func:`dpicl_audit.verdicts.claims.calibration_departure`: the exact epsilon of the noise the
server reports must not exceed the claim). A calibration can be right where the plan looks
and wrong elsewhere: the classical formula without its analytic guard is exact below epsilon
1 and reports a sigma whose exact epsilon is 18.9 at a claimed 16 (delta 1e-5), which the
default plan (epsilon 1 to 8) never asks for. So after the trials a Gaussian mechanism's run
creates one context (budgeted for one answer, never asked) at each epsilon of :data:`SCAN`
(around the plan's range) that the plan does not audit, reads the sigma it reports, and
checks it the same way: the auditor's exact epsilon of that sigma at the design's
sensitivity, and the server's own
``epsilon_exact``, must not exceed the epsilon asked for. Either above it is a BUG (exit 5)
naming the epsilon; a refused epsilon (above the server's ``DPICL_MAX_EPSILON``) is listed,
not a finding. No answer is released: the scan costs a context creation per epsilon. The
result is ``results["calibration"]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from dpicl_audit.claims import SettingClaims
from dpicl_audit.client import AuditTarget, ContextBody
from dpicl_audit.context_info import ContextInfo, context_info
from dpicl_audit.errors import TargetError, TargetRejected
from dpicl_audit.probes.ingredients import Ingredients
from dpicl_audit.probes.sections import CalibrationPoint, CalibrationSection
from dpicl_audit.verdicts.claims import calibration_departure

__all__ = ["SCAN", "probe", "scan_calibration"]

#: The epsilons scanned: around the default plan's 1 to 8 (which its settings check), the
#: low end of a useful per-answer claim, the first power of two above the plan and the
#: server's default DPICL_MAX_EPSILON (100). The auditor's exact epsilon costs little at
#: these (the closed form above 9, a coarse PLD below 1; the middle's PLD costs 0.2-0.6 s a
#: value), and a context creation 35-140 ms on the server: three, not a grid.
SCAN = (0.1, 16.0, 100.0)


async def scan_calibration(
    target: AuditTarget,
    body: Callable[[float], ContextBody | None],
    claims: Callable[[float, ContextInfo], SettingClaims],
    audited: Iterable[float],
) -> CalibrationSection:
    """The scan of the module docstring. ``body(epsilon)``: a context body at ``epsilon``
    budgeted for one answer (None where no budget within the server's limit holds one);
    ``claims(epsilon, info)``: the setting's claims :func:`calibration_departure` reads, from
    the created context's ``info``; ``audited``: the plan's epsilons (checked with its settings)."""
    skip = {float(e) for e in audited}
    points: list[CalibrationPoint] = []
    for eps in (e for e in SCAN if e not in skip):
        made = body(eps)
        if made is None:
            points.append({"epsilon": eps, "status": "unchecked", "message": "no budget fits"})
            continue
        try:
            info = context_info(await target.create_context(made))
        except TargetRejected as exc:
            points.append({"epsilon": eps, "status": "refused", "message": exc.message})
            continue
        try:
            found = claims(eps, info)
        finally:
            with contextlib.suppress(TargetError):
                await target.delete_context(info["id"])
        weaker = calibration_departure(found)
        point: CalibrationPoint = {
            "epsilon": eps,
            "status": "ok" if weaker is None else "bug",
            "sigma": found.sigma,
            "epsilon_exact": found.epsilon_exact,
        }
        if weaker is not None:
            point["message"] = weaker
        points.append(point)
    bugs = [p for p in points if p["status"] == "bug"]
    checked = [p["epsilon"] for p in points if p["status"] in ("ok", "bug")]
    if bugs:
        message = f"BUG at epsilon {bugs[0]['epsilon']:g}: {bugs[0]['message']}"
    else:
        # A mechanism with other noise than the Gaussian (a Laplace scale) reports no sigma.
        noise = "sigma" if any(p.get("sigma") is not None for p in points) else "noise"
        message = (
            f"the reported {noise} meets the claim at epsilon "
            f"{', '.join(f'{e:g}' for e in checked) or 'none checked'}"
        )
    return {"status": "bug" if bugs else "ok", "message": message, "points": points}


async def probe(target: AuditTarget, kit: Ingredients) -> CalibrationSection | None:
    """The scan for the run's mechanism: a context of C1's body holding one answer at each
    epsilon, read as the setting's own claim check reads it (:attr:`Ingredients.claim`)."""
    if kit.claim is None:
        return None

    def body(eps: float) -> ContextBody | None:
        return kit.held(1, eps, 1, "calibration")

    return await scan_calibration(target, body, kit.claim, kit.epsilons)
