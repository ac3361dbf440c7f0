"""DPS-MOZO's claim against the calibration it reports (issue 35, item 4): deterministic.

A proven-mode context reports its ``max_log_ratio`` eps0 and ``per_token_epsilon``. The
auditor re-derives the exact epsilon of the whole context from eps0 alone, by the chain
docs/privacy.md proves (its own code, not the server's):

1. per token, pure DP under replace-one: ``eps_tok = 4 eps0`` (``2 eps0`` with one shot);
2. amplification by subsampling ``n_shots`` of ``|D|`` without replacement:
   ``log(1 + q (e^eps_tok - 1))``, ``q = n_shots / |D|`` (Balle, Barthe and Gaboardi 2018,
   Theorem 9);
3. the optimal adaptive composition of ``tokens = queries x max_tokens`` such steps (Kairouz,
   Oh and Viswanath 2015): the ``tokens``-fold randomized response, whose ``delta(E)`` is a
   difference of two binomial CDFs; the exact epsilon is the smallest ``E`` with
   ``delta(E) <= delta`` (bisection, rounded up).

Either departure is a BUG: the exact epsilon above the claimed one (eps0 calibrated for fewer
tokens than the context answers, a composition forgotten), or a reported per-token epsilon
below ``4 eps0`` (the reported figure understates the step it composes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from scipy.special import expit
from scipy.stats import binom

from dpicl_audit.context_info import ContextInfo, MechanismInfo

__all__ = ["CLAIM_TOL", "mozo_claim_departure", "mozo_exact_epsilon", "per_token_bound"]

#: Relative tolerance: the server calibrates eps0 to about 1e-12; read as broken above this.
CLAIM_TOL = 1e-4


def _delta_at(total: float, eps: float, steps: int) -> float:
    """Exact delta at ``total`` of ``steps`` composed ``eps``-DP steps (randomized response:
    the loss is ``eps (steps - 2 l)``, ``l`` ~ Binomial(steps, 1/(1+e^eps)) under P)."""
    if steps == 0 or eps == 0.0 or total >= steps * eps:
        return 0.0
    l_star = math.ceil(0.5 * (steps - total / eps)) - 1
    if l_star < 0:
        return 0.0
    log_fp = float(binom.logcdf(l_star, steps, expit(-eps)))
    log_fq = float(binom.logcdf(l_star, steps, expit(eps)))
    if not math.isfinite(log_fp):
        return 0.0
    return max(0.0, math.exp(log_fp) * -math.expm1(min(total + log_fq - log_fp, 0.0)))


def mozo_exact_epsilon(
    eps0: float, n_shots: int, sample_rate: float, tokens: int, delta: float
) -> float:
    """The exact total epsilon at ``delta`` of ``tokens`` proven-mode tokens at ``eps0``."""
    per_token = (2.0 if n_shots == 1 else 4.0) * eps0
    step = math.log1p(sample_rate * math.expm1(per_token))
    if tokens <= 0 or step == 0.0 or _delta_at(0.0, step, tokens) <= delta:
        return 0.0
    lo, hi = 0.0, tokens * step
    for _ in range(200):  # bisection to float resolution; the result is the upper end
        mid = 0.5 * (lo + hi)
        if _delta_at(mid, step, tokens) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return hi


def mozo_claim_departure(
    mech: MechanismInfo, claim: float, exemplars: int
) -> tuple[float | None, str | None]:
    """``(exact epsilon from the reported eps0, the reason it breaks the claim or None)``
    for a proven-mode context's ``mechanism`` record; ``(None, None)`` where it reports no
    eps0 (paper mode). ``exemplars``: the context's |D| (the auditor's own count)."""
    eps0, per_token = mech.get("max_log_ratio"), mech.get("per_token_epsilon")
    if eps0 is None:
        return None, None
    n_shots = int(mech.get("n_shots") or exemplars)
    queries, max_tokens = int(mech.get("queries") or 1), int(mech.get("max_tokens") or 1)
    delta = float(mech["delta"])
    tokens = queries * max_tokens
    exact = mozo_exact_epsilon(float(eps0), n_shots, n_shots / exemplars, tokens, delta)
    limit = claim * (1 + CLAIM_TOL) + 1e-9
    own_step = (2.0 if n_shots == 1 else 4.0) * float(eps0)
    if exact > limit:
        return exact, (
            f"the reported calibration (eps0 {float(eps0):.6g}) is weaker than claimed: its "
            f"exact epsilon over {queries} x {max_tokens} tokens at q = {n_shots}/{exemplars} "
            f"and delta {delta:g} is {exact:.4g}, above the claimed epsilon {claim:g} (a "
            "deterministic check, not a statistical one)"
        )
    if per_token is not None and float(per_token) < own_step * (1 - CLAIM_TOL):
        return exact, (
            f"the reported per-token epsilon {float(per_token):.6g} understates the step of "
            f"eps0 {float(eps0):.6g} ({own_step:.6g} under replace-one): the composition it "
            "reports is of a weaker mechanism than it claims"
        )
    return exact, None


def per_token_bound(infos: Sequence[ContextInfo]) -> float | None:
    """The per-token bound from the contexts' reported eps0 (the larger one): ``4 eps0``,
    ``2 eps0`` with one shot; None where one reports no eps0 (not the proven mode)."""
    found = []
    for info in infos:
        mech = info.get("mechanism")
        eps0 = mech.get("max_log_ratio") if isinstance(mech, Mapping) else None
        if not isinstance(eps0, int | float):
            return None
        shots = mech.get("n_shots") if isinstance(mech, Mapping) else None
        found.append((2.0 if shots == 1 else 4.0) * float(eps0))
    return max(found) if found else None
