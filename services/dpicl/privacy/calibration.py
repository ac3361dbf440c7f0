r"""Noise calibration of the Gaussian mechanism and its exact privacy curve.

Voting (paper 000, Algorithm 2) and ESA (Algorithm 3) release f(C) + N(0, sigma^2 I) for a
function f of L2 sensitivity Delta2 under the adjacency in use (then post-process it: the
argmax, the nearest candidate). Such a release is *exactly* mu-Gaussian-DP with
mu = Delta2 / sigma (Dong, Roth and Su 2019, Theorem 2.7), and its tight (epsilon, delta)
curve is (paper 000, Section 2; Balle and Wang 2018, Theorem 8)

.. math::

    \delta(\epsilon; \mu) = \Phi(-\epsilon/\mu + \mu/2) - e^{\epsilon}\,\Phi(-\epsilon/\mu - \mu/2).

Two calibrations turn a target (epsilon, delta) into sigma:

``"classic"``
    sigma = Delta2 sqrt(2 ln(1.25/delta)) / epsilon (Dwork and Roth 2014, Theorem A.1), the
    formula of paper 000, Algorithm 2 line 7, with Delta2 = sqrt(2). The theorem is proved
    only for epsilon < 1; the formula in fact keeps its promise up to epsilon of about 8
    (depending on delta) and breaks beyond (at delta = 1e-5, epsilon = 16 it delivers only
    epsilon = 18.9). :func:`sigma_for` therefore returns max(classic, analytic): exactly the
    paper's sigma wherever that sigma is private enough, and never less private than
    promised. :func:`classic_sigma` is the raw formula.
``"analytic"``
    The smallest sigma with delta(epsilon; Delta2/sigma) <= delta (Balle and Wang 2018, the
    analytic Gaussian mechanism): exact, so always below the classic sigma.

The exact epsilon reported with every release comes from dp-accounting's PLD accountant
(:func:`epsilon_exact`), an independent pessimistic numerical estimate of the same curve;
tests check that both agree to far better than 1e-3 relative.
"""

from __future__ import annotations

import math
import operator
from functools import lru_cache
from typing import Literal, get_args

from scipy.optimize import brentq
from scipy.special import log_ndtr

from dpicl.errors import ConfigurationError

__all__ = [
    "PLD_RELATIVE_INTERVAL",
    "Calibration",
    "analytic_sigma",
    "classic_sigma",
    "epsilon_exact",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu",
    "sigma_for",
    "validate_privacy_params",
]

Calibration = Literal["classic", "analytic"]

#: dp-accounting's PLD discretisation step, relative to the composed mu. The privacy loss of
#: a mu-Gaussian spans about 20 mu after truncation, so this keeps ~2e4 grid points whatever
#: mu is (about 0.05 s) and an epsilon error measured below 1e-6 relative (tests assert 1e-3).
PLD_RELATIVE_INTERVAL = 1e-3

#: Largest composed mu given to the PLD accountant. Its grid spans the privacy loss, about
#: mu^2 + 20 mu, in steps of PLD_RELATIVE_INTERVAL * mu: ~1e5 points (seconds) at mu = 50,
#: and an absurd mu (issue 12: epsilon = 1.97e11 asked for 21.6 GB) would exhaust memory.
#: Beyond it the exact closed form (:func:`gaussian_epsilon`) answers instead. The request
#: schema keeps one answer's mu below 15.
PLD_MAX_MU = 50.0

# brentq's smallest allowed relative tolerance: roots to machine precision.
_RTOL = 4.0 * 2.220446049250313e-16
_XTOL = 1e-300
_MAXITER = 500


def _index(value: int) -> int:
    # operator.index, but booleans (a frequent slip for counts) are rejected.
    if isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return operator.index(value)


def _check_finite_positive(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _check_delta(delta: float) -> float:
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    return d


def validate_privacy_params(
    epsilon: float, delta: float, *, param_prefix: str = "mechanism"
) -> None:
    """Raise :class:`ConfigurationError` naming the value unless epsilon is finite and > 0
    and 0 < delta < 1. ``param`` is ``"<param_prefix>.epsilon"`` (or ``.delta``)."""
    prefix = f"{param_prefix}." if param_prefix else ""
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        eps = math.nan
    if not math.isfinite(eps) or eps <= 0.0:
        raise ConfigurationError(
            f"epsilon must be a finite number > 0, got {epsilon!r}", param=f"{prefix}epsilon"
        )
    try:
        d = float(delta)
    except (TypeError, ValueError):
        d = math.nan
    if not 0.0 < d < 1.0:  # also false for NaN
        raise ConfigurationError(
            f"delta must lie strictly between 0 and 1, got {delta!r}", param=f"{prefix}delta"
        )


def classic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """sigma = Delta2 sqrt(2 ln(1.25/delta)) / epsilon (Dwork and Roth 2014, Theorem A.1;
    paper 000, Algorithm 2 line 7 with Delta2 = sqrt(2)). Proven (epsilon, delta)-DP only
    for epsilon < 1; see :func:`sigma_for` for the guarded version."""
    eps = _check_finite_positive("epsilon", epsilon)
    d = _check_delta(delta)
    sens = _check_finite_positive("sensitivity", sensitivity)
    return sens * math.sqrt(2.0 * math.log(1.25 / d)) / eps


def _log_terms(epsilon: float, mu: float) -> tuple[float, float]:
    # log Phi(-eps/mu + mu/2) and log(e^eps Phi(-eps/mu - mu/2)), each accurate to machine
    # precision even deep in the tails (log_ndtr uses an asymptotic series there).
    a = float(log_ndtr(-epsilon / mu + mu / 2.0))
    b = epsilon + float(log_ndtr(-epsilon / mu - mu / 2.0))
    return a, b


def gaussian_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2): the tight delta
    of a mu-GDP mechanism at epsilon (paper 000, Section 2; Dong, Roth and Su 2019,
    Corollary 2.13). Decreasing in epsilon, increasing in mu.

    Computed as Phi(a) * (1 - exp(log B - log Phi(a))) so that the difference of two nearly
    equal tail probabilities keeps its relative accuracy (no catastrophic cancellation)."""
    eps = float(epsilon)
    m = float(mu)
    if math.isnan(eps) or math.isnan(m) or eps < 0.0 or m < 0.0:
        raise ValueError(f"need epsilon >= 0 and mu >= 0, got epsilon={epsilon!r}, mu={mu!r}")
    if m == 0.0:
        return 0.0  # identical output distributions
    if math.isinf(m):
        return 1.0
    if math.isinf(eps):
        return 0.0
    a, b = _log_terms(eps, m)
    if b >= a:  # only through roundoff when mu is far below machine precision
        return 0.0
    return math.exp(a) * -math.expm1(b - a)


def gaussian_epsilon(delta: float, mu: float) -> float:
    """The smallest epsilon >= 0 with delta(epsilon; mu) <= delta: the tight epsilon of a
    mu-GDP mechanism (paper 000, Section 2, the GDP-to-DP conversion). Solved by Brent's
    method to machine precision, then nudged upward until the inequality holds in floating
    point, so the value is never optimistic."""
    d = _check_delta(delta)
    m = float(mu)
    if math.isnan(m) or m < 0.0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    if math.isinf(m):
        return math.inf
    if gaussian_delta(0.0, m) <= d:
        return 0.0

    hi = max(1.0, m * m)
    while gaussian_delta(hi, m) > d:
        hi *= 2.0
    eps = float(
        brentq(
            lambda e: gaussian_delta(e, m) - d, 0.0, hi, xtol=_XTOL, rtol=_RTOL, maxiter=_MAXITER
        )
    )
    # Brent returns a point within the final bracket; make sure it is on the safe side.
    for step in range(64):
        if gaussian_delta(eps, m) <= d:
            break
        eps = math.nextafter(eps, math.inf) if step < 32 else eps * (1.0 + 1e-12)
    return eps


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The largest mu with delta(epsilon; mu) <= delta: the most a Gaussian mechanism (or a
    composition of them) may reveal within (epsilon, delta). Brent's method on the increasing
    function mu -> delta(epsilon; mu), nudged downward until the inequality holds in floating
    point, so the value is never optimistic."""
    eps = _check_finite_positive("epsilon", epsilon)
    d = _check_delta(delta)

    # Bracket [lo, hi] with delta(lo) <= d < delta(hi).
    lo, hi = 0.5, 1.0
    while gaussian_delta(eps, hi) <= d:
        lo, hi = hi, hi * 2.0
    while gaussian_delta(eps, lo) > d:
        lo, hi = lo / 2.0, lo
    mu = float(
        brentq(
            lambda x: gaussian_delta(eps, x) - d, lo, hi, xtol=_XTOL, rtol=_RTOL, maxiter=_MAXITER
        )
    )
    for step in range(64):
        if gaussian_delta(eps, mu) <= d:
            break
        mu = math.nextafter(mu, 0.0) if step < 32 else mu * (1.0 - 1e-12)
    return mu


def analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """sigma = Delta2 / mu*(epsilon, delta), the smallest noise that makes the Gaussian
    mechanism (epsilon, delta)-DP (Balle and Wang 2018, the analytic Gaussian mechanism,
    Theorem 8 with the exact condition solved numerically)."""
    sens = _check_finite_positive("sensitivity", sensitivity)
    d = _check_delta(delta)
    eps = float(epsilon)
    sigma = sens / gaussian_mu(eps, d)
    # sens / (sens / mu) need not round back to mu: step sigma up until the guarantee holds
    # for the very mu = sens / sigma that the accounting will later recompute.
    for _ in range(64):
        if gaussian_delta(eps, sens / sigma) <= d:
            break
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def sigma_for(
    epsilon: float, delta: float, sensitivity: float, calibration: Calibration = "classic"
) -> float:
    """The noise scale sigma for a Gaussian mechanism of L2 sensitivity ``sensitivity`` to be
    (epsilon, delta)-DP.

    ``"classic"``: the paper's formula (:func:`classic_sigma`), raised to the analytic sigma
    in the rare large-epsilon cases where the formula alone would not deliver (epsilon,
    delta); ``"analytic"``: :func:`analytic_sigma`. Raises :class:`ConfigurationError` for
    invalid epsilon/delta or an unknown calibration name.
    """
    validate_privacy_params(epsilon, delta)
    if calibration not in get_args(Calibration):
        raise ConfigurationError(
            f"calibration must be one of {list(get_args(Calibration))}, got {calibration!r}",
            param="mechanism.calibration",
        )
    tight = analytic_sigma(epsilon, delta, sensitivity)
    if calibration == "analytic":
        return tight
    # Dwork-Roth's Theorem A.1 is proved for epsilon < 1 only; beyond about epsilon = 8 the
    # formula really does overshoot. Never promise more privacy than is delivered.
    return max(classic_sigma(epsilon, delta, sensitivity), tight)


@lru_cache(maxsize=4096)
def _pld_epsilon(noise_multiplier: float, count: int, delta: float) -> float:
    # Imported here: dp-accounting takes about a second to import and most processes that
    # import this module (the auditor's tests, the CLI's --help) never need it.
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    mu = math.sqrt(count) / noise_multiplier
    # ADD_OR_REMOVE_ONE with sensitivity 1 is the pair N(0, s^2) vs N(1, s^2), i.e. exactly
    # the mu-Gaussian curve; our sensitivity already is that of the adjacency in use.
    accountant = PLDAccountant(value_discretization_interval=PLD_RELATIVE_INTERVAL * mu)
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=noise_multiplier), count)
    return float(accountant.get_epsilon(delta))


def epsilon_exact(sigma: float, sensitivity: float, delta: float, count: int = 1) -> float:
    """epsilon at ``delta`` of ``count`` compositions of the Gaussian mechanism with noise
    ``sigma`` and L2 sensitivity ``sensitivity``, from dp-accounting's PLD accountant
    (a pessimistic numerical estimate: never below the true value, above it by less than
    ~1e-6 relative with :data:`PLD_RELATIVE_INTERVAL`). Cached: contexts ask for the same
    values again and again. Above :data:`PLD_MAX_MU` (far outside any request's range) the
    exact closed form answers, so the cost is bounded whatever the inputs."""
    s = _check_finite_positive("sigma", sigma)
    sens = _check_finite_positive("sensitivity", sensitivity)
    d = _check_delta(delta)
    k = _index(count)
    if k < 1:
        raise ValueError(f"count must be >= 1, got {count!r}")
    mu = math.sqrt(k) * sens / s
    if mu > PLD_MAX_MU:
        return gaussian_epsilon(d, mu)
    return _pld_epsilon(s / sens, k, d)
