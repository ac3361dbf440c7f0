r"""Privacy accounting for the Gaussian mechanisms (voting, ESA) in units of mu^2.

Why mu^2 is the right ledger unit, and why the bookkeeping is tight rather than a bound:

1. Each answer releases f(C) + N(0, sigma^2 I) followed by post-processing (the noisy
   argmax of voting, the nearest candidate of ESA). The noisy vector itself is exactly
   mu-GDP with mu = Delta2 / sigma (Dong, Roth and Su 2019, "Gaussian differential privacy",
   Theorem 2.7), and post-processing cannot increase the privacy loss (ibid., Proposition
   2.8), so the released label or text is mu-GDP too. (The argmax may leak less; we charge
   for the noisy vector, which is what the white-box debug endpoint returns anyway.)
2. The k-fold adaptive composition of mu_i-GDP mechanisms is exactly
   sqrt(mu_1^2 + ... + mu_k^2)-GDP (ibid., Corollary 3.3), with no slack: composing Gaussian
   mechanisms gives a Gaussian mechanism. So the ledger only has to add mu_i^2.
3. A budget (epsilon, delta) is therefore the largest mu_max with
   delta(epsilon; mu_max) <= delta on the exact curve
   delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (paper 000, Section 2),
   stored as mu2_max = mu_max^2. A charge is allowed while mu2_spent + mu2 <= mu2_max.

A ledger in epsilon (adding epsilons, or even the advanced composition theorem) would be
loose by a factor growing with k; in mu^2 the spent epsilon reported after k answers is the
exact epsilon of the composed mechanism.

A pure epsilon-DP answer (a Laplace mechanism, say) enters the same sum through
:func:`pure_dp_mu2`. DPS-MOZO is not Gaussian and keeps its own accountant, budgeted in
queries (``dpicl.mechanisms.dps_mozo``).
"""

from __future__ import annotations

import math

from scipy.special import expit, ndtri

from dpicl.privacy.calibration import (
    epsilon_exact,
    gaussian_epsilon,
    gaussian_mu,
    validate_privacy_params,
)

__all__ = [
    "MU2_RTOL",
    "budget_mu2",
    "fits",
    "gaussian_mu2",
    "mu2_limit",
    "pure_dp_mu2",
    "remaining_queries",
    "spent_epsilon",
    "spent_epsilon_pld",
]

#: Relative tolerance of every "does it fit" test on mu^2, here and in the ledger's
#: conditional UPDATE (``mu2_spent + mu2 <= mu2_max * (1 + MU2_RTOL)``). Sums of k float
#: charges carry a relative roundoff of about k * 1e-16; without the tolerance a budget
#: designed to hold exactly k answers could refuse the k-th. The admitted excess of at most
#: 1e-9 relative in mu^2 changes epsilon by at most ~1e-9 relative, far below the precision
#: with which any epsilon is stated.
MU2_RTOL = 1e-9


def _finite_nonnegative(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return v


def gaussian_mu2(sigma: float, sensitivity: float) -> float:
    """mu^2 = (Delta2 / sigma)^2: the ledger cost of one Gaussian release (Dong, Roth and Su
    2019, Theorem 2.7)."""
    s = float(sigma)
    sens = float(sensitivity)
    if not (math.isfinite(s) and s > 0.0):
        raise ValueError(f"sigma must be finite and > 0, got {sigma!r}")
    if not (math.isfinite(sens) and sens > 0.0):
        raise ValueError(f"sensitivity must be finite and > 0, got {sensitivity!r}")
    return (sens / s) ** 2


def pure_dp_mu2(epsilon: float) -> float:
    """mu^2 of the smallest mu for which every epsilon-DP mechanism is mu-GDP.

    An epsilon-DP mechanism's trade-off function is at least f_eps(a) = max(0, 1 - e^eps a,
    e^-eps (1 - a)) (Dong, Roth and Su, Section 2.2; randomized response attains it), a
    polygon through (0, 1), (a*, a*) and (1, 0) with a* = 1/(1 + e^eps). The Gaussian
    trade-off G_mu is convex and symmetric with G_mu(0) = 1, G_mu(1) = 0 and fixed point
    Phi(-mu/2); so G_mu <= f_eps everywhere exactly when Phi(-mu/2) <= a*, i.e.
    mu >= 2 Phi^-1(e^eps / (1 + e^eps)). At that mu, "epsilon-DP implies mu-GDP" holds,
    and no smaller mu does (randomized response): the conversion is exact for the worst
    epsilon-DP mechanism and conservative for the rest, and the event then composes with
    the Gaussian ones by adding mu^2 (Corollary 3.3)."""
    eps = _finite_nonnegative("epsilon", epsilon)
    # Phi^-1(expit(eps)) = -Phi^-1(expit(-eps)): the lower tail keeps its precision.
    mu = -2.0 * float(ndtri(expit(-eps)))
    return mu * mu


def budget_mu2(epsilon: float, delta: float) -> float:
    """mu2_max: the largest composed mu^2 whose exact curve stays within (epsilon, delta),
    i.e. gaussian_mu(epsilon, delta)^2. Raises
    :class:`~dpicl.errors.ConfigurationError` (``param="budget.epsilon"``/``"budget.delta"``)
    for invalid values."""
    validate_privacy_params(epsilon, delta, param_prefix="budget")
    return gaussian_mu(epsilon, delta) ** 2


def spent_epsilon(mu2_spent: float, delta: float) -> float:
    """The exact epsilon at ``delta`` of everything charged so far: the composed mechanism is
    sqrt(mu2_spent)-GDP (Corollary 3.3), converted on the exact curve. 0 when nothing was
    spent."""
    m2 = _finite_nonnegative("mu2_spent", mu2_spent)
    if m2 == 0.0:
        return 0.0
    return gaussian_epsilon(delta, math.sqrt(m2))


def spent_epsilon_pld(mu2_spent: float, delta: float) -> float:
    """:func:`spent_epsilon` computed by dp-accounting's PLD accountant instead of the closed
    form (a pessimistic estimate; for cross-checks)."""
    m2 = _finite_nonnegative("mu2_spent", mu2_spent)
    if m2 == 0.0:
        return 0.0
    return epsilon_exact(1.0 / math.sqrt(m2), 1.0, delta)


def mu2_limit(mu2_max: float) -> float:
    """The largest admissible mu2_spent, tolerance included: mu2_max * (1 + MU2_RTOL)."""
    return _finite_nonnegative("mu2_max", mu2_max) * (1.0 + MU2_RTOL)


def fits(mu2_spent: float, mu2: float, mu2_max: float) -> bool:
    """Whether a charge of ``mu2`` fits: the very test of the ledger's conditional UPDATE."""
    return _finite_nonnegative("mu2_spent", mu2_spent) + _finite_nonnegative(
        "mu2", mu2
    ) <= mu2_limit(mu2_max)


def remaining_queries(mu2_spent: float, mu2_max: float, mu2_per_query: float) -> int:
    """How many more answers of cost ``mu2_per_query`` fit, i.e. the largest k >= 0 with
    mu2_spent + k * mu2_per_query <= mu2_max * (1 + MU2_RTOL)."""
    spent = _finite_nonnegative("mu2_spent", mu2_spent)
    per = float(mu2_per_query)
    if not (math.isfinite(per) and per > 0.0):
        raise ValueError(f"mu2_per_query must be finite and > 0, got {mu2_per_query!r}")
    limit = mu2_limit(mu2_max)
    if spent > limit:
        return 0
    k = math.floor((limit - spent) / per)
    # The division can round across an integer; settle on the exact inequality.
    while k > 0 and spent + k * per > limit:
        k -= 1
    while spent + (k + 1) * per <= limit:
        k += 1
    return max(k, 0)
