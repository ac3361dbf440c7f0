"""Privacy calibration of DPS-MOZO (paper 004, Appendices A-B; DESIGN.md section 4).

The accounting chain of the paper, for a fixed integer Renyi order ``alpha``:

1. One generated token is ``(alpha, 4 * beta * alpha)``-RDP (Theorem B.3): every mixed
   distribution lies within Renyi radius ``beta * alpha`` of the zero-shot distribution, in
   both directions, and the triangle-like inequality doubles the square root.
2. Drawing the ``n_shots`` demonstrations without replacement from ``|D|`` exemplars, with
   ``q = n_shots / |D|``, amplifies this to ``eps'(alpha)`` by the bound of Wang, Balle and
   Kasiviswanathan (2019) quoted as Theorem A.4 (:func:`subsampled_rdp`).
3. ``tokens = n_test * T_max`` subsampled tokens compose to ``tokens * eps'(alpha)``-RDP
   (Theorem A.2).
4. That total is converted to ``(epsilon, delta)``-DP by Theorem A.3 (Balle et al. 2020),
   ``epsilon = rdp + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1)``;
   solved for ``rdp`` this is the RDP target ``epsilon~`` (:func:`rdp_target`, the column
   epsilon~ of Table 5).

``beta`` is the largest value with ``tokens * eps'(alpha) <= epsilon~`` (Equation 8). Only the
guarantee at the single order ``alpha`` is known: the mechanism bounds the divergence at
``alpha``, and RDP is non-decreasing in the order, so the per-order epsilons ``eps(j)`` needed by
Theorem A.4 for ``j <= alpha`` are all bounded by ``4 * beta * alpha`` (DESIGN.md). Nothing
bounds ``eps(inf)``, so the ``min{2, (e^{eps(inf)} - 1)^j}`` factors of Theorem A.4 are ``2``.
Logarithms are natural throughout.

Read this way, the calibration reproduces every beta of Table 5 of paper 004 (see
``tests/server/test_mozo_calibration.py``): ``delta = 1/|D|`` and ``q = 4/|D|`` with ``|D|`` the
training-set size of Table 3, and ``tokens`` the column ``T_max n_test``. :func:`choose_alpha`
reproduces every alpha of that table.

This module implements the paper's accounting faithfully. Step 1 (Theorem B.3) is the paper's
claim and is not generally true (see :mod:`.release`, "Caveat"); the numbers
here are therefore the paper's nominal epsilon, not a proven bound for Algorithm 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp

from dpicl.errors import ConfigurationError

__all__ = [
    "MozoCalibration",
    "calibrate_beta",
    "choose_alpha",
    "mozo_epsilon",
    "mozo_rdp",
    "rdp_target",
    "rdp_to_dp",
    "subsampled_rdp",
]

_LOG2 = math.log(2.0)


# --------------------------------------------------------------------------- validation


def _check_epsilon(epsilon: float) -> float:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigurationError(
            f"epsilon must be a positive finite number, got {epsilon!r}", param="mechanism.epsilon"
        )
    return float(epsilon)


def _check_delta(delta: float) -> float:
    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        raise ConfigurationError(
            f"delta must lie strictly between 0 and 1, got {delta!r}", param="mechanism.delta"
        )
    return float(delta)


def _check_order(alpha: float, *, integer: bool) -> None:
    if integer:
        if isinstance(alpha, bool) or not isinstance(alpha, int | np.integer) or alpha < 2:
            raise ConfigurationError(
                f"alpha must be an integer >= 2 (Theorem A.4 of paper 004), got {alpha!r}",
                param="mechanism.alpha",
            )
    elif not (math.isfinite(alpha) and alpha > 1.0):
        raise ConfigurationError(
            f"alpha must be a finite Renyi order > 1, got {alpha!r}", param="mechanism.alpha"
        )


def _check_sample_rate(q: float) -> float:
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise ConfigurationError(
            f"the sampling rate q = n_shots/|D| must lie in (0, 1], got {q!r}",
            param="mechanism.n_shots",
        )
    return float(q)


def _check_tokens(tokens: int, *, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if isinstance(tokens, bool) or not isinstance(tokens, int | np.integer) or tokens < low:
        raise ConfigurationError(
            f"the number of generated tokens must be an integer >= {low}, got {tokens!r}",
            param="mechanism.max_tokens",
        )
    return int(tokens)


def _check_beta(beta: float) -> float:
    if not (math.isfinite(beta) and beta >= 0.0):
        raise ConfigurationError(
            f"beta must be a finite number >= 0, got {beta!r}", param="mechanism.beta"
        )
    return float(beta)


# --------------------------------------------------------------------------- Theorem A.3


def _conversion_cost(delta: float, alpha: float) -> float:
    """``epsilon - rdp`` in Theorem A.3: ``log((a-1)/a) - (log(delta) + log(a)) / (a-1)``."""
    return math.log((alpha - 1.0) / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1.0)


def rdp_target(epsilon: float, delta: float, alpha: float) -> float:
    """The total RDP at order ``alpha`` that Theorem A.3 of paper 004 turns into
    ``(epsilon, delta)``-DP:
    ``epsilon - log((alpha-1)/alpha) + (log(delta) + log(alpha))/(alpha-1)``.

    This is the column epsilon~ of Table 5. It can be <= 0 when ``alpha`` is too small for
    ``delta``; :func:`calibrate_beta` rejects such an order.
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    _check_order(alpha, integer=False)
    return float(epsilon) - _conversion_cost(delta, float(alpha))


def rdp_to_dp(rdp_epsilon: float, delta: float, alpha: float) -> float:
    """Theorem A.3 forwards: ``(alpha, rdp_epsilon)``-RDP implies ``(epsilon, delta)``-DP with
    the returned ``epsilon`` (clipped at 0, since epsilon = 0 is always at least as strong)."""
    _check_delta(delta)
    _check_order(alpha, integer=False)
    if not (rdp_epsilon >= 0.0):
        raise ValueError(f"an RDP epsilon must be >= 0, got {rdp_epsilon!r}")
    if math.isinf(rdp_epsilon):
        return math.inf
    return max(0.0, float(rdp_epsilon) + _conversion_cost(delta, float(alpha)))


# --------------------------------------------------------------------------- Theorem A.4


def _log_binom(n: int, k: int) -> float:
    return float(gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1))


def _log_min_two_pow(eps_inf: float, j: int) -> float:
    """``log min{2, (e^{eps_inf} - 1)^j}``."""
    if math.isinf(eps_inf):
        return _LOG2
    if eps_inf <= 0.0:
        return -math.inf
    return min(_LOG2, j * math.log(math.expm1(eps_inf)))


def subsampled_rdp(
    alpha: int,
    q: float,
    per_order_eps: Callable[[int], float] | float,
    *,
    eps_inf: float = math.inf,
) -> float:
    """Theorem A.4 of paper 004 (Wang, Balle and Kasiviswanathan 2019, Theorem 9): the RDP at
    the integer order ``alpha >= 2`` of a mechanism run on ``m`` points drawn without
    replacement from ``n`` (``q = m/n``), given the mechanism's RDP ``eps(j)`` at the orders
    ``j = 2..alpha`` (``per_order_eps``: a callable, or one number used for every order) and
    ``eps_inf`` (its pure-DP level; ``inf`` when unbounded, as for DPS-MOZO)::

        eps'(alpha) <= 1/(alpha-1) * log(1 + q^2 C(alpha,2) min{4(e^{eps(2)}-1),
                                                              e^{eps(2)} min{2, (e^{eps(inf)}-1)^2}}
                                      + sum_{j=3}^{alpha} q^j C(alpha,j) e^{(j-1) eps(j)}
                                                          min{2, (e^{eps(inf)}-1)^j})

    Evaluated in log space (``gammaln`` binomials, ``logsumexp``, ``log1p``), so it neither
    overflows for large ``eps(j)`` nor loses the tiny values produced by small ``q``.
    """
    _check_order(alpha, integer=True)
    q = _check_sample_rate(q)
    alpha = int(alpha)

    def eps_at(j: int) -> float:
        value = float(per_order_eps(j) if callable(per_order_eps) else per_order_eps)
        if not (value >= 0.0):
            raise ValueError(f"eps({j}) must be >= 0, got {value!r}")
        return value

    log_q = math.log(q)
    eps2 = eps_at(2)
    if math.isinf(eps2):
        return math.inf
    # log(4 (e^eps2 - 1)) = log 4 + eps2 + log(1 - e^-eps2); -inf at eps2 = 0.
    log_four = -math.inf if eps2 == 0.0 else math.log(4.0) + eps2 + math.log(-math.expm1(-eps2))
    log_other = eps2 + _log_min_two_pow(eps_inf, 2)
    terms = [2.0 * log_q + _log_binom(alpha, 2) + min(log_four, log_other)]
    for j in range(3, alpha + 1):
        eps_j = eps_at(j)
        if math.isinf(eps_j):
            return math.inf
        terms.append(
            j * log_q + _log_binom(alpha, j) + (j - 1) * eps_j + _log_min_two_pow(eps_inf, j)
        )
    log_rest = float(logsumexp(np.asarray(terms, dtype=np.float64)))
    # log(1 + e^log_rest) without losing precision when log_rest is very negative.
    return float(np.logaddexp(0.0, log_rest)) / (alpha - 1)


# --------------------------------------------------------------------------- DPS-MOZO


def mozo_rdp(beta: float, alpha: int, tokens: int, sample_rate: float) -> float:
    """Total RDP at order ``alpha`` of ``tokens`` DPS-MOZO tokens with target leakage ``beta``:
    ``tokens * eps'(alpha)`` with ``eps(j) = 4 beta alpha`` for every ``j <= alpha``."""
    beta = _check_beta(beta)
    _check_order(alpha, integer=True)
    tokens = _check_tokens(tokens, allow_zero=True)
    sample_rate = _check_sample_rate(sample_rate)
    if tokens == 0:
        return 0.0
    return tokens * subsampled_rdp(int(alpha), sample_rate, 4.0 * beta * int(alpha))


def mozo_epsilon(
    beta: float,
    alpha: int,
    tokens: int,
    sample_rate: float,
    delta: float,
    *,
    optimize_order: bool = False,
) -> float:
    """The ``epsilon`` of ``(epsilon, delta)``-DP spent after ``tokens`` DPS-MOZO tokens (the
    inverse of :func:`calibrate_beta`: at the calibrated beta and the full token count it
    returns the configured epsilon, up to the root-finding tolerance).

    By default the conversion uses the calibration order ``alpha`` only, as the paper does. With
    ``optimize_order=True`` it takes the minimum over the integer orders ``2..alpha`` (still
    sound: the per-token guarantee at ``alpha`` bounds every smaller order), which is smaller
    when few tokens have been spent. Zero tokens cost nothing.
    """
    _check_delta(delta)
    _check_order(alpha, integer=True)
    tokens = _check_tokens(tokens, allow_zero=True)
    if tokens == 0:
        _check_beta(beta)
        _check_sample_rate(sample_rate)
        return 0.0
    per_token = 4.0 * _check_beta(beta) * int(alpha)
    orders = range(2, int(alpha) + 1) if optimize_order else (int(alpha),)
    best = math.inf
    for order in orders:
        rdp = tokens * subsampled_rdp(order, sample_rate, per_token)
        best = min(best, rdp_to_dp(rdp, delta, order))
    return best


@dataclass(frozen=True, slots=True)
class MozoCalibration:
    """The outcome of :func:`calibrate_beta`.

    ``rdp_epsilon`` is the *total* RDP budget at ``alpha`` over all ``tokens`` (the epsilon~ of
    Table 5, from Theorem A.3); each token may spend ``rdp_epsilon / tokens`` after subsampling
    (:attr:`per_token_subsampled_rdp` is what it actually spends, <= that share).
    ``per_token_rdp = 4 * beta * alpha`` is one token's RDP *before* subsampling (Theorem B.3).
    """

    beta: float
    alpha: int
    rdp_epsilon: float
    per_token_rdp: float
    tokens: int
    sample_rate: float
    epsilon: float
    delta: float

    @property
    def per_token_subsampled_rdp(self) -> float:
        """``eps'(alpha)`` of one token at the calibrated beta (Theorem A.4)."""
        return subsampled_rdp(self.alpha, self.sample_rate, self.per_token_rdp)

    @property
    def radius(self) -> float:
        """The Renyi radius ``beta * alpha`` that bounds each mixed distribution."""
        return self.beta * self.alpha


def choose_alpha(epsilon: float, delta: float, *, alpha_max: int = 1024) -> int:
    """The Renyi order of the paper's experiments (Section 5.1: "We chose alpha such that
    eps(alpha) ~ eps/2, so that the conversion cost from RDP to (eps, delta)-DP is about
    eps/2"): the smallest integer ``alpha >= 2`` whose RDP target (:func:`rdp_target`) is at
    least ``epsilon / 2``, i.e. whose conversion cost is at most half the budget.

    This reproduces all nine orders of Table 5 of paper 004; "nearest to eps/2" would not
    (it picks 13, 5 and 17 instead of 14, 6 and 18 for three rows).
    """
    epsilon = _check_epsilon(epsilon)
    delta = _check_delta(delta)
    for alpha in range(2, alpha_max + 1):
        if rdp_target(epsilon, delta, alpha) >= epsilon / 2.0:
            return alpha
    raise ConfigurationError(
        f"no Renyi order up to {alpha_max} converts to (epsilon={epsilon}, delta={delta})-DP "
        "at a cost of at most epsilon/2; increase delta or epsilon",
        param="mechanism.delta",
    )


def calibrate_beta(
    epsilon: float,
    delta: float,
    alpha: int | None,
    tokens: int,
    sample_rate: float,
    *,
    xtol: float = 1e-12,
) -> MozoCalibration:
    """The largest target leakage ``beta`` with ``tokens * eps'(alpha) <= epsilon~``
    (Equation 8 of paper 004), found by Brent's method on a bracket, then nudged to the
    feasible side so that the inequality holds exactly at the returned beta.

    ``alpha=None`` picks the order with :func:`choose_alpha`. ``tokens`` is the total number
    of tokens to be generated (``n_queries * T_max``); ``sample_rate`` is ``n_shots / |D|``.
    """
    epsilon = _check_epsilon(epsilon)
    delta = _check_delta(delta)
    if alpha is None:
        alpha = choose_alpha(epsilon, delta)
    _check_order(alpha, integer=True)
    alpha = int(alpha)
    tokens = _check_tokens(tokens)
    sample_rate = _check_sample_rate(sample_rate)

    target = rdp_target(epsilon, delta, alpha)
    if target <= 0.0:
        raise ConfigurationError(
            f"at alpha={alpha} the RDP-to-DP conversion for delta={delta} already costs more "
            f"than epsilon={epsilon}; use a larger alpha",
            param="mechanism.alpha",
        )

    def slack(beta: float) -> float:
        return tokens * subsampled_rdp(alpha, sample_rate, 4.0 * beta * alpha) - target

    if slack(0.0) > 0.0:
        # Theorem A.4 is not zero at eps = 0 (its j >= 3 terms carry min{2, .} = 2).
        raise ConfigurationError(
            f"{tokens} tokens at sampling rate q={sample_rate} exceed the budget "
            f"(epsilon={epsilon}, delta={delta}) even at beta=0; allow fewer tokens or "
            "use more exemplars",
            param="mechanism.max_tokens",
        )
    high = 1.0
    while slack(high) <= 0.0:
        high *= 2.0
        if high > 1e12:  # pragma: no cover - the bound grows at least linearly in beta
            raise ConfigurationError(
                "beta is unbounded for these settings", param="mechanism.epsilon"
            )
    beta = float(brentq(slack, 0.0, high, xtol=xtol, rtol=4 * np.finfo(float).eps))
    step = max(xtol, abs(beta) * 1e-15)
    while beta > 0.0 and slack(beta) > 0.0:
        beta = max(0.0, beta - step)
        step *= 2.0
    return MozoCalibration(
        beta=beta,
        alpha=alpha,
        rdp_epsilon=target,
        per_token_rdp=4.0 * beta * alpha,
        tokens=tokens,
        sample_rate=sample_rate,
        epsilon=epsilon,
        delta=delta,
    )
