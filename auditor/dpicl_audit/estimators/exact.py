"""The mechanisms' own privacy curves, computed independently of the server.

* ``epsilon_exact``: the true (epsilon, delta) of a (composed) Gaussian mechanism of a given
  L2 sensitivity (each mechanism's folder says which: voting's ``exact.py``, ESA's), from
  dp-accounting's privacy-loss-distribution (PLD) accountant. The server has its own
  accounting code; this one deliberately shares none of it, so that an error in either shows
  up as a disagreement in the report.
* ``epsilon_theory`` helpers: the noise the classical formula (Dwork and Roth, Theorem A.1;
  paper 000, Algorithm 2) and the analytic Gaussian mechanism (Balle and Wang 2018) give for a
  target (epsilon, delta).

``VOTING_SENSITIVITY`` (``sqrt(2)``) is the noise formulas' default sensitivity, that of
paper 000's Algorithm 2 which they are quoted from.
"""

from __future__ import annotations

import math
from functools import lru_cache

import dp_accounting
from dp_accounting.pld import PLDAccountant

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.gdp import gdp_epsilon, gdp_mu
from dpicl_audit.estimators.stats import check_delta

__all__ = [
    "CLOSED_FORM_BELOW",
    "VOTING_SENSITIVITY",
    "analytic_sigma",
    "classic_sigma",
    "gaussian_epsilon_exact",
]

VOTING_SENSITIVITY = math.sqrt(2.0)


def _positive(value: float, name: str) -> float:
    v = float(value)
    if not v > 0.0:
        raise InvalidAuditInput(f"{name} must be positive, got {value!r}")
    return v


def gaussian_epsilon_exact(
    sigma: float,
    sensitivity: float,
    delta: float,
    count: int = 1,
    *,
    value_discretization_interval: float = 1e-4,
) -> float:
    """epsilon at ``delta`` of ``count`` compositions of the Gaussian mechanism.

    Each release adds ``N(0, sigma^2)`` per coordinate to a function of L2 sensitivity
    ``sensitivity``. Computed by dp-accounting's PLD accountant (a pessimistic discretisation:
    the value is an upper bound on the true epsilon, within about
    ``value_discretization_interval`` per composition); one release whose noise multiplier
    is below :data:`CLOSED_FORM_BELOW`, by the closed form. ``sensitivity == 0`` gives 0.
    """
    s = _positive(sigma, "sigma")
    d = check_delta(delta)
    sens = float(sensitivity)
    if not sens >= 0.0:
        raise InvalidAuditInput(f"sensitivity must be non-negative, got {sensitivity!r}")
    if count < 1:
        raise InvalidAuditInput(f"count must be at least 1, got {count}")
    if sens == 0.0:
        return 0.0
    if count == 1 and s / sens < CLOSED_FORM_BELOW:
        # One Gaussian release has a closed-form privacy profile (Balle and Wang 2018,
        # Theorem 8: mu-GDP with mu = sensitivity / sigma), exact where the PLD is an upper
        # bound; the PLD's discretisation of so large a privacy loss costs 1-6 s a value.
        return gdp_epsilon(sens / s, d)
    return _pld_epsilon(s / sens, d, int(count), float(value_discretization_interval))


#: Below this noise multiplier (sigma / sensitivity; voting's classical calibration reaches it
#: above epsilon 9 at delta 1e-5) one release's epsilon is the closed form, not the PLD's; the
#: two agree to 1e-8 relative where both run (tests/auditor/test_estimators.py).
CLOSED_FORM_BELOW = 0.5


@lru_cache(maxsize=4096)
def _pld_epsilon(noise_multiplier: float, delta: float, count: int, interval: float) -> float:
    # Depends only on (sigma / sensitivity, delta, count): an audit asks for the same few
    # values for every estimate, and one PLD evaluation costs tens of milliseconds (issue 13).
    accountant = PLDAccountant(value_discretization_interval=interval)
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=noise_multiplier), count)
    return max(0.0, float(accountant.get_epsilon(delta)))


def classic_sigma(epsilon: float, delta: float, sensitivity: float = VOTING_SENSITIVITY) -> float:
    """The classical Gaussian-mechanism noise ``Delta2 sqrt(2 ln(1.25 / delta)) / epsilon``.

    With ``Delta2 = sqrt(2)`` this is ``2 sqrt(ln(1.25 / delta)) / epsilon`` (paper 000,
    Algorithm 2). The formula is only proven for epsilon < 1; above that it is what a server
    configured with it uses, and the exact epsilon of the result differs from the target.
    """
    e = _positive(epsilon, "epsilon")
    d = check_delta(delta)
    return float(sensitivity) * math.sqrt(2.0 * math.log(1.25 / d)) / e


def analytic_sigma(epsilon: float, delta: float, sensitivity: float = VOTING_SENSITIVITY) -> float:
    """The smallest noise with exactly (epsilon, delta)-DP: the analytic Gaussian mechanism.

    Balle and Wang (2018): ``sigma = Delta2 / mu`` for the largest mu with
    ``Phi(mu/2 - epsilon/mu) - e^epsilon Phi(-mu/2 - epsilon/mu) <= delta``.
    """
    e = _positive(epsilon, "epsilon")
    return float(sensitivity) / gdp_mu(e, delta)
