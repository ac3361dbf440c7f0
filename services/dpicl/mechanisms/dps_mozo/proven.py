r"""Accounting of DPS-MOZO's proven mode (docs/privacy.md has the proofs).

The chain, for a context of ``|D|`` exemplars, ``n_shots`` shots per token and
``tokens = queries * max_tokens`` tokens in all:

1. **Per token, pure DP.** Every mixed distribution is within max-log-ratio ``eps0`` of the
   zero-shot distribution on the released support, so one token is ``eps_tok``-DP under
   replace-one with ``eps_tok = 4 eps0`` (``2 eps0`` with one shot): :func:`per_token_epsilon`.
2. **Amplification by subsampling.** The shots are ``n_shots`` of ``|D|`` drawn uniformly
   without replacement; for an ``eps``-DP mechanism under the substitution relation this gives
   ``log(1 + q (e^eps - 1))``-DP with ``q = n_shots/|D|`` (Balle, Barthe and Gaboardi 2018,
   "Privacy amplification by subsampling: tight analyses via couplings and divergences",
   Theorem 9, sampling without replacement with substitution neighbours; delta' = q delta = 0
   here): :func:`amplified_epsilon`.
3. **Adaptive composition.** ``tokens`` adaptively chosen ``eps'``-DP mechanisms compose, at
   best, exactly like ``tokens`` randomized responses with parameter ``eps'`` (Kairouz, Oh
   and Viswanath 2015, "The composition theorem for differential privacy", Theorems 3.3
   and 3.5: randomized response dominates every ``eps'``-DP mechanism and the composition of
   the dominating pairs dominates the adaptive composition). Its privacy loss is
   ``eps' (k - 2 l)`` with ``l`` binomial, so the exact ``delta(epsilon)`` is a difference
   of two binomial CDFs (:func:`composed_delta`): O(1) work for any number of tokens. This
   is the optimal composition theorem itself, evaluated in closed form; KOV's sum
   (:func:`kov_delta`, Theorem 3.3 as printed) and dp-accounting's PLD
   (:func:`composed_epsilon_pld`, a pessimistic discretisation of the same pair) are the
   cross-checks in ``tests/server/test_mozo_proven.py``.

:func:`calibrate_max_log_ratio` inverts the chain: the largest ``eps0`` whose total epsilon at
``delta`` is within the target (bracketed root finding; bounded work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom

from dpicl.errors import ConfigurationError

__all__ = [
    "ProvenCalibration",
    "amplified_epsilon",
    "calibrate_max_log_ratio",
    "composed_delta",
    "composed_epsilon",
    "composed_epsilon_pld",
    "kov_delta",
    "per_token_epsilon",
    "proven_epsilon",
]

#: Upper end of the eps0 search: far beyond any useful value (a radius of 20 nats lets each
#: shot move a probability by e^20) and small enough that e^(4 eps0) stays finite.
EPS0_MAX = 20.0


def per_token_epsilon(max_log_ratio: float, n_shots: int) -> float:
    """Pure DP of one released token under replace-one: ``4 eps0``, ``2 eps0`` for one shot
    (with one shot the normaliser is 1 and only the replaced factor moves)."""
    if not (math.isfinite(max_log_ratio) and max_log_ratio >= 0.0):
        raise ConfigurationError(
            f"max_log_ratio must be a finite number >= 0, got {max_log_ratio!r}",
            param="mechanism.max_log_ratio",
        )
    if isinstance(n_shots, bool) or not isinstance(n_shots, int | np.integer) or n_shots < 1:
        raise ConfigurationError(
            f"n_shots must be an integer >= 1, got {n_shots!r}", param="mechanism.n_shots"
        )
    return (2.0 if n_shots == 1 else 4.0) * float(max_log_ratio)


def amplified_epsilon(epsilon: float, sample_rate: float) -> float:
    """``log(1 + q (e^epsilon - 1))``: an ``epsilon``-DP mechanism run on ``m`` of ``n``
    points drawn without replacement, ``q = m/n``, under replace-one (Balle, Barthe and
    Gaboardi 2018, Theorem 9)."""
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    if not (math.isfinite(sample_rate) and 0.0 < sample_rate <= 1.0):
        raise ConfigurationError(
            f"the sampling rate q = n_shots/|D| must lie in (0, 1], got {sample_rate!r}",
            param="mechanism.n_shots",
        )
    return math.log1p(sample_rate * math.expm1(epsilon))


def _check_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 0:
        raise ConfigurationError(
            f"the number of tokens must be an integer >= 0, got {steps!r}",
            param="mechanism.max_tokens",
        )
    return int(steps)


def _check_delta(delta: float) -> float:
    if not (math.isfinite(delta) and 0.0 < delta < 1.0):
        raise ConfigurationError(
            f"delta must lie strictly between 0 and 1, got {delta!r}", param="mechanism.delta"
        )
    return float(delta)


def composed_delta(epsilon_total: float, epsilon: float, steps: int) -> float:
    """The exact ``delta`` at ``epsilon_total`` of ``steps`` composed ``epsilon``-DP
    mechanisms (optimal composition, Kairouz, Oh and Viswanath 2015).

    The dominating pair is the ``steps``-fold randomized response: under ``P`` the number
    ``l`` of "flipped" answers is Binomial(steps, 1/(1+e^eps)) and under ``Q``
    Binomial(steps, e^eps/(1+e^eps)); the privacy loss is ``eps (steps - 2 l)``. The hockey
    stick divergence is ``P[L > E] - e^E Q[L > E] = F_P(l*) - e^E F_Q(l*)`` with ``l*`` the
    largest ``l`` whose loss exceeds ``E`` (terms with loss exactly ``E`` contribute 0).
    """
    steps = _check_steps(steps)
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    if not (epsilon_total >= 0.0):
        raise ValueError(f"epsilon_total must be >= 0, got {epsilon_total!r}")
    if steps == 0 or epsilon == 0.0 or epsilon_total >= steps * epsilon:
        return 0.0
    # loss eps (steps - 2 l) > E  <=>  l < (steps - E/eps) / 2
    bound = 0.5 * (steps - epsilon_total / epsilon)
    l_star = math.ceil(bound) - 1
    if l_star < 0:
        return 0.0
    log_fp = float(binom.logcdf(l_star, steps, expit(-epsilon)))
    log_fq = float(binom.logcdf(l_star, steps, expit(epsilon)))
    if not math.isfinite(log_fp):
        return 0.0
    gap = epsilon_total + log_fq - log_fp  # <= 0: the loss exceeds E on every counted l
    return max(0.0, math.exp(log_fp) * -math.expm1(min(gap, 0.0)))


def composed_epsilon(epsilon: float, steps: int, delta: float, *, xtol: float = 1e-12) -> float:
    """The smallest ``epsilon_total`` with :func:`composed_delta` ``<= delta``: the exact
    (epsilon_total, delta) guarantee of ``steps`` adaptively composed ``epsilon``-DP steps.
    The result is nudged up until the inequality holds at it, so it never understates."""
    delta = _check_delta(delta)
    steps = _check_steps(steps)
    if steps == 0 or epsilon == 0.0:
        return 0.0
    high = steps * epsilon
    if composed_delta(0.0, epsilon, steps) <= delta:
        return 0.0

    def excess(e: float) -> float:
        return composed_delta(e, epsilon, steps) - delta

    value = float(brentq(excess, 0.0, high, xtol=xtol, rtol=4 * np.finfo(float).eps))
    step = max(xtol, value * 1e-15)
    while value < high and excess(value) > 0.0:
        value = min(high, value + step)
        step *= 2.0
    return value


def kov_delta(epsilon: float, steps: int, i: int) -> float:
    """Kairouz, Oh and Viswanath 2015, Theorem 3.3 as printed: the ``steps``-fold composition
    of ``epsilon``-DP mechanisms is ``((steps - 2 i) epsilon, delta_i)``-DP, optimally, with
    ``delta_i = sum_{l=0}^{i-1} C(steps, l) (e^{(steps-l) eps} - e^{(steps-2i+l) eps})
    / (1 + e^eps)^steps``. A direct O(steps) sum, as the reference for the tests."""
    steps = _check_steps(steps)
    if not (0 <= i <= steps // 2):
        raise ValueError(f"i must lie in [0, steps // 2], got {i}")
    total = 0.0
    log_norm = steps * float(np.logaddexp(0.0, epsilon))
    for l_ in range(i):
        log_c = math.lgamma(steps + 1) - math.lgamma(l_ + 1) - math.lgamma(steps - l_ + 1)
        hi = (steps - l_) * epsilon
        lo = (steps - 2 * i + l_) * epsilon
        total += math.exp(log_c + hi - log_norm) * -math.expm1(lo - hi)
    return total


def composed_epsilon_pld(
    epsilon: float, steps: int, delta: float, *, value_discretization_interval: float = 1e-4
) -> float:
    """dp-accounting's PLD accountant on the same dominating pair (the pure ``epsilon``-DP
    pair, i.e. randomized response), self-composed ``steps`` times. Pessimistic (rounds the
    losses up), so it is >= :func:`composed_epsilon`; used as a cross-check."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pld = pld_lib.from_privacy_parameters(
        pld_lib.common.DifferentialPrivacyParameters(epsilon, 0.0),
        value_discretization_interval=value_discretization_interval,
    )
    return float(pld.self_compose(_check_steps(steps)).get_epsilon_for_delta(delta))


def proven_epsilon(
    max_log_ratio: float, n_shots: int, sample_rate: float, tokens: int, delta: float
) -> float:
    """Total epsilon at ``delta`` after ``tokens`` proven-mode tokens (steps 1-3 above)."""
    per_token = per_token_epsilon(max_log_ratio, n_shots)
    return composed_epsilon(amplified_epsilon(per_token, sample_rate), tokens, delta)


@dataclass(frozen=True, slots=True)
class ProvenCalibration:
    """The outcome of :func:`calibrate_max_log_ratio`: ``max_log_ratio`` is eps0, each token
    is ``per_token_epsilon``-DP (``amplified_epsilon`` after subsampling), and ``tokens`` of
    them are (``epsilon_spent``, ``delta``)-DP with ``epsilon_spent <= epsilon``."""

    max_log_ratio: float
    per_token_epsilon: float
    amplified_epsilon: float
    epsilon_spent: float
    epsilon: float
    delta: float
    tokens: int
    n_shots: int
    sample_rate: float


def calibrate_max_log_ratio(
    epsilon: float, delta: float, n_shots: int, sample_rate: float, tokens: int
) -> ProvenCalibration:
    """The largest eps0 in ``[0, EPS0_MAX]`` whose :func:`proven_epsilon` is ``<= epsilon``
    (Brent's method on a bracket, then nudged to the feasible side)."""
    if not (math.isfinite(epsilon) and epsilon > 0.0):
        raise ConfigurationError(
            f"epsilon must be a positive finite number, got {epsilon!r}",
            param="mechanism.epsilon",
        )
    delta = _check_delta(delta)
    tokens = _check_steps(tokens)
    if tokens < 1:
        raise ConfigurationError(
            f"the number of tokens must be >= 1, got {tokens}", param="mechanism.max_tokens"
        )
    per_token_epsilon(0.0, n_shots)  # validates n_shots
    amplified_epsilon(0.0, sample_rate)  # validates the rate

    def slack(eps0: float) -> float:
        return proven_epsilon(eps0, int(n_shots), sample_rate, tokens, delta) - epsilon

    if slack(EPS0_MAX) <= 0.0:
        eps0 = EPS0_MAX
    else:
        eps0 = float(brentq(slack, 0.0, EPS0_MAX, xtol=1e-13, rtol=4 * np.finfo(float).eps))
        step = max(1e-13, eps0 * 1e-12)
        while eps0 > 0.0 and slack(eps0) > 0.0:
            eps0 = max(0.0, eps0 - step)
            step *= 2.0
    per_token = per_token_epsilon(eps0, n_shots)
    amplified = amplified_epsilon(per_token, sample_rate)
    return ProvenCalibration(
        max_log_ratio=eps0,
        per_token_epsilon=per_token,
        amplified_epsilon=amplified,
        epsilon_spent=composed_epsilon(amplified, tokens, delta),
        epsilon=float(epsilon),
        delta=delta,
        tokens=tokens,
        n_shots=int(n_shots),
        sample_rate=float(sample_rate),
    )
