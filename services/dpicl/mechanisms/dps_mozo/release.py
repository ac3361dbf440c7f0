"""DPS-MOZO, one token at a time (paper 004, Algorithm 1; DESIGN.md section 4).

Pure numpy/scipy functions; randomness only from the ``rng`` passed in. All logits here live
on the public top-k support: ``one_shot_logits`` has shape ``(n_shots, k)`` and
``zero_logits`` shape ``(k,)``, both gathered at the vocabulary ids ``top_ids`` (shape
``(k,)``, chosen from the zero-shot logits, which leak nothing about the exemplars). Restricting
to those ids and renormalising is exactly Lines 5-10 of Algorithm 1 (every other logit set to
``-inf``).

For each shot the mixed logits ``lambda * one + (1 - lambda) * zero`` (Equation 2) get the
largest ``lambda`` in ``[0, lam_max]`` that keeps the mixed distribution close to the zero-shot
one, and the token is drawn from the normalised product of the mixed distributions (Line 16).
"Close" has two meanings (``mechanism.guarantee``):

* ``"proven"`` (the default, dpicl's repair): ``max_y |log q(y) - log p0(y)| <= eps0`` over
  the released support (:func:`solve_lambdas_max_ratio`). Then every token is pure
  ``4 eps0``-DP (``2 eps0`` with one shot) under replace-one; docs/privacy.md has the proof
  and :mod:`dpicl.mechanisms.dps_mozo.proven` the accounting.
* ``"paper"``: ``max(D_alpha(mixed || zero), D_alpha(zero || mixed)) <= beta * alpha``
  (Equation 3, :func:`solve_lambdas`); its claimed per-token bound is false (Caveat below),
  so its epsilon is nominal.

Monotonicity. Write ``d = one - zero`` and ``A(t) = log sum_y zero_y e^{t d_y}`` (``zero`` the
zero-shot probabilities), the log-partition function of the exponential family
``p_t ∝ zero * e^{t d}``; ``A`` is convex. Then, exactly,
``D_alpha(p_t || p_0) = (A(alpha t) - alpha A(t)) / (alpha - 1)`` with derivative
``alpha (A'(alpha t) - A'(t)) / (alpha - 1) >= 0`` for ``t >= 0``, and
``D_alpha(p_0 || p_t) = (A((1 - alpha) t) + (alpha - 1) A(t)) / (alpha - 1)`` with derivative
``A'(t) - A'((1 - alpha) t) >= 0``. Both divergences are therefore non-decreasing in
``lambda >= 0``, the feasible set is an interval ``[0, lambda*]``, and bisection finds its
right end. :func:`solve_lambdas` does not rely on this for safety: it always returns a point
where the bound holds (the feasible end of the final bracket), and where the bound holds at
``lam_max`` it returns ``lam_max``. If rounding ever made the divergence non-monotone, the
result would be a feasible crossing point, the largest one within the final bracket; the tests
compare it with a dense scan (the largest feasible lambda before the first violation).

Caveat (a finding, see ``test_theorem_b3_counterexample``): the per-token guarantee
``(alpha, 4 beta alpha)``-RDP that Theorem B.3 derives from this constraint does not hold in
general. Its triangle step (Theorem B.1, Steinke's Lemma 33.7) needs ``D_g <= eps * g`` at
every order ``g``, but Line 13 bounds one order only: with one shot, alpha = 2, beta = 0.05,
zero-shot logits (0, -20) and neighbouring one-shot logits (0, -10) and (0, -40), both mixed
distributions satisfy the constraint while ``D_2`` between them is about 15.5 > 0.4. And its
additivity step (Theorem B.2) is about product measures, whereas Line 16 samples from a
normalised pointwise product. :func:`~.diagnostics.exact_shot_divergence` and
:func:`~.diagnostics.product_divergence` measure the actual divergences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import elementwise

from dpicl.errors import ConfigurationError

__all__ = [
    "MozoStep",
    "log_softmax",
    "max_log_ratio",
    "mixed_logits",
    "mozo_step",
    "product_distribution",
    "renyi_divergence",
    "sample_shots",
    "sample_token",
    "solve_lambdas",
    "solve_lambdas_max_ratio",
    "symmetric_divergence",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_LAMBDA_MAX = 1.5
_LAMBDA_XATOL = 1e-10
#: Bisection steps of :func:`solve_lambdas_max_ratio`: the bracket shrinks to
#: ``lam_max * 2**-60``, below float resolution near 1; the cost is fixed whatever the input.
_BISECTION_STEPS = 60
#: The proven-mode search aims at ``eps0 * (1 - _RATIO_MARGIN)`` so that a reader who
#: recomputes the log-ratio from the reported (rounded) probabilities never sees an excess
#: from rounding alone (log of a float64 probability is off by at most ~1e-16 relative).
_RATIO_MARGIN = 1e-9


# --------------------------------------------------------------------------- basic pieces


def _check_alpha(alpha: float) -> float:
    if not (np.isfinite(alpha) and alpha > 1.0):
        raise ConfigurationError(
            f"alpha must be a finite Renyi order > 1, got {alpha!r}", param="mechanism.alpha"
        )
    return float(alpha)


def _check_beta(beta: float) -> float:
    if not (np.isfinite(beta) and beta >= 0.0):
        raise ConfigurationError(
            f"beta must be a finite number >= 0, got {beta!r}", param="mechanism.beta"
        )
    return float(beta)


def _logsumexp(x: FloatArray, *, keepdims: bool = False) -> FloatArray:
    """``log(sum(exp(x)))`` over the last axis (scipy's version is ~50x slower on small arrays,
    and the lambda search calls this in a loop). All ``-inf`` rows give ``-inf``."""
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - top), axis=-1, keepdims=True)) + top
    return np.asarray(out if keepdims else out[..., 0], dtype=np.float64)


def log_softmax(logits: npt.ArrayLike) -> FloatArray:
    """Normalised log-probabilities along the last axis (``-inf`` logits stay ``-inf``)."""
    x = np.asarray(logits, dtype=np.float64)
    return np.asarray(x - _logsumexp(x, keepdims=True), dtype=np.float64)


def renyi_divergence(p_logits: npt.ArrayLike, q_logits: npt.ArrayLike, alpha: float) -> FloatArray:
    """``D_alpha(P || Q)`` of categorical distributions given by (unnormalised) logits, in nats,
    vectorised over broadcast leading axes (the last axis is the category):
    ``1/(alpha-1) * log sum_y P(y)^alpha Q(y)^(1-alpha)``, evaluated with ``logsumexp``.

    Categories with ``P(y) = 0`` (logit ``-inf``) contribute nothing; a category with
    ``P(y) > 0 = Q(y)`` makes the divergence ``inf``. Pass log-probabilities as logits to use
    probabilities (``np.log(probs)``). Results are clipped at 0 (rounding can make them -1e-17).
    """
    a = _check_alpha(alpha)
    log_p = log_softmax(p_logits)
    log_q = log_softmax(q_logits)
    log_p, log_q = np.broadcast_arrays(log_p, log_q)
    with np.errstate(invalid="ignore"):
        terms = a * log_p + (1.0 - a) * log_q
    terms = np.where(np.isneginf(log_p), -np.inf, terms)
    value = _logsumexp(terms) / (a - 1.0)
    return np.asarray(np.maximum(value, 0.0), dtype=np.float64)


def symmetric_divergence(
    p_logits: npt.ArrayLike, q_logits: npt.ArrayLike, alpha: float
) -> FloatArray:
    """``(D_alpha(P || Q), D_alpha(Q || P))`` stacked on a new last axis (shape ``(..., 2)``);
    the paper's ``D^<->_alpha`` (Equation 1) is their maximum."""
    forward = renyi_divergence(p_logits, q_logits, alpha)
    backward = renyi_divergence(q_logits, p_logits, alpha)
    return np.stack([forward, backward], axis=-1)


def _as_shots(
    one_shot_logits: npt.ArrayLike, zero_logits: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    one = np.asarray(one_shot_logits, dtype=np.float64)
    zero = np.asarray(zero_logits, dtype=np.float64)
    if one.ndim != 2 or zero.ndim != 1 or one.shape[1] != zero.shape[0] or zero.shape[0] == 0:
        raise ValueError(
            "expected one-shot logits of shape (n_shots, k) and zero-shot logits of shape (k,), "
            f"got {one.shape} and {zero.shape}"
        )
    if not (np.all(np.isfinite(one)) and np.all(np.isfinite(zero))):
        raise ValueError("logits on the top-k support must be finite")
    return one, zero


def mixed_logits(
    one_shot_logits: npt.ArrayLike, zero_logits: npt.ArrayLike, lambdas: npt.ArrayLike
) -> FloatArray:
    """Equation 2: ``lambda_i * one_i + (1 - lambda_i) * zero`` for each shot ``i``
    (shape ``(n_shots, k)``); computed as ``zero + lambda (one - zero)`` so that
    ``lambda = 0`` gives the zero-shot logits exactly."""
    one = np.asarray(one_shot_logits, dtype=np.float64)
    zero = np.asarray(zero_logits, dtype=np.float64)
    lam = np.asarray(lambdas, dtype=np.float64)[..., None]
    return np.asarray(zero + lam * (one - zero), dtype=np.float64)


def product_distribution(mixed: npt.ArrayLike) -> FloatArray:
    """Line 16: the normalised (pointwise) product of the softmaxed rows of ``mixed``
    (shape ``(n_shots, k)``), computed as the softmax of the summed log-softmaxes."""
    m = np.asarray(mixed, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] == 0:
        raise ValueError(f"expected mixed logits of shape (n_shots >= 1, k), got {m.shape}")
    log_prod = log_softmax(m).sum(axis=0)
    return np.asarray(np.exp(log_softmax(log_prod)), dtype=np.float64)


def sample_token(probs: npt.ArrayLike, rng: np.random.Generator) -> int:
    """One index drawn from ``probs`` (renormalised; inverse CDF on one uniform)."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("probs must be a non-empty 1-d array of finite non-negative numbers")
    cdf = np.cumsum(p)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("probs sum to zero")
    u = rng.random() * total
    index = int(np.searchsorted(cdf, u, side="right"))
    # u < total, so index <= size - 1 unless rounding in cumsum; never pick a zero-mass entry.
    index = min(index, p.size - 1)
    while p[index] == 0.0:
        index -= 1
    return index


def sample_shots(n_exemplars: int, n_shots: int, rng: np.random.Generator) -> IntArray:
    """Line 3: ``n_shots`` distinct exemplar indices, uniformly without replacement."""
    if isinstance(n_exemplars, bool) or not isinstance(n_exemplars, int | np.integer):
        raise ConfigurationError(
            f"the number of exemplars must be an integer, got {n_exemplars!r}",
            param="mechanism.n_shots",
        )
    if isinstance(n_shots, bool) or not isinstance(n_shots, int | np.integer) or n_shots < 1:
        raise ConfigurationError(
            f"n_shots must be an integer >= 1, got {n_shots!r}", param="mechanism.n_shots"
        )
    if n_shots > n_exemplars:
        raise ConfigurationError(
            f"n_shots={n_shots} exceeds the {n_exemplars} exemplars of the context",
            param="mechanism.n_shots",
        )
    chosen = rng.choice(int(n_exemplars), size=int(n_shots), replace=False)
    return np.asarray(chosen, dtype=np.int64)


# --------------------------------------------------------------------------- lambda search


def _excess(
    lam: FloatArray, one: FloatArray, zero: FloatArray, alpha: float, radius: float
) -> FloatArray:
    """``max(D(mixed || zero), D(zero || mixed)) - radius`` for each row; ``lam`` has the
    leading shape of ``one`` minus the last axis. Finite logits only (checked by callers), so
    no support masking is needed; this is the hot loop of the lambda search."""
    log_q = zero - _logsumexp(zero, keepdims=True)
    mixed = zero + lam[..., None] * (one - zero)
    log_p = mixed - _logsumexp(mixed, keepdims=True)
    forward = _logsumexp(alpha * log_p + (1.0 - alpha) * log_q)
    backward = _logsumexp(alpha * log_q + (1.0 - alpha) * log_p)
    worst = np.maximum(np.maximum(forward, backward) / (alpha - 1.0), 0.0)
    return np.asarray(worst - radius, dtype=np.float64)


def solve_lambdas(
    one_shot_logits: npt.ArrayLike,
    zero_logits: npt.ArrayLike,
    beta: float,
    alpha: float,
    lam_max: float = DEFAULT_LAMBDA_MAX,
    *,
    xatol: float = _LAMBDA_XATOL,
) -> FloatArray:
    """Equation 3 for every shot at once: the largest ``lambda`` in ``[0, lam_max]`` with
    ``max(D_alpha(mixed || zero), D_alpha(zero || mixed)) <= beta * alpha``.

    ``lambda = 0`` always satisfies the bound (divergence 0); where ``lam_max`` does too, the
    answer is ``lam_max``. Otherwise a bracketing root finder
    (``scipy.optimize.elementwise.find_root``, Chandrupatla's safeguarded bisection) runs on
    the bracket ``[0, lam_max]`` for all remaining shots together and the feasible end of its
    final bracket is returned: within ``xatol`` of the boundary and never violating the bound.
    The divergences are non-decreasing in ``lambda`` (module docstring), so this is the
    largest feasible value.
    """
    one, zero = _as_shots(one_shot_logits, zero_logits)
    a = _check_alpha(alpha)
    radius = _check_beta(beta) * a
    if not (np.isfinite(lam_max) and lam_max >= 0.0):
        raise ConfigurationError(
            f"lam_max must be a finite number >= 0, got {lam_max!r}",
            param="mechanism.lambda_max",
        )
    n_shots = one.shape[0]
    result = np.full(n_shots, float(lam_max), dtype=np.float64)
    if n_shots == 0 or lam_max == 0.0:
        return result
    at_max = _excess(result, one, zero, a, radius)
    todo = np.flatnonzero(at_max > 0.0)
    if todo.size == 0:
        return result
    one_t, zero_t = one[todo], zero

    def f(lam: FloatArray, rows: npt.NDArray[np.float64]) -> FloatArray:
        idx = np.asarray(rows, dtype=np.int64)
        return _excess(np.asarray(lam, dtype=np.float64), one_t[idx], zero_t, a, radius)

    rows = np.arange(todo.size, dtype=np.float64)
    res = elementwise.find_root(
        f,
        (np.zeros(todo.size), np.full(todo.size, float(lam_max))),
        args=(rows,),
        tolerances={"xatol": xatol, "xrtol": 0.0, "fatol": 0.0, "frtol": 0.0},
    )
    low, high = (np.asarray(b, dtype=np.float64) for b in res.bracket)
    f_low, f_high = (np.asarray(v, dtype=np.float64) for v in res.f_bracket)
    # The feasible end: the bracket keeps a sign change, so at least one end has f <= 0.
    chosen = np.where(f_high <= 0.0, high, np.where(f_low <= 0.0, low, 0.0))
    chosen = np.minimum(np.maximum(chosen, 0.0), float(lam_max))
    # Safety net (rounding in a re-evaluation must not break the bound).
    bad = _excess(chosen, one_t, zero_t, a, radius) > 0.0
    chosen[bad] = 0.0
    result[todo] = chosen
    return result


def max_log_ratio(log_q: npt.ArrayLike, log_p0: npt.ArrayLike) -> FloatArray:
    """``max_y |log q(y) - log p0(y)|`` along the last axis (both normalised log-probabilities
    on the same support): the max-divergence radius of ``q`` around ``p0``, both directions."""
    diff = np.asarray(log_q, dtype=np.float64) - np.asarray(log_p0, dtype=np.float64)
    return np.asarray(np.max(np.abs(diff), axis=-1), dtype=np.float64)


def _ratio_rows(lam: FloatArray, one: FloatArray, zero: FloatArray) -> FloatArray:
    """The radius of each row's mixed distribution, computed exactly as the released mixed
    probabilities are (``log_softmax`` of the mixed logits against that of the zero-shot)."""
    return max_log_ratio(log_softmax(mixed_logits(one, zero, lam)), log_softmax(zero))


def solve_lambdas_max_ratio(
    one_shot_logits: npt.ArrayLike,
    zero_logits: npt.ArrayLike,
    eps0: float,
    lam_max: float = DEFAULT_LAMBDA_MAX,
) -> FloatArray:
    """The proven mode's constraint for every shot at once: the largest ``lambda`` in
    ``[0, lam_max]`` with ``max_y |log q_lambda(y) - log p0(y)| <= eps0`` over the support,
    ``q_lambda = softmax(zero + lambda (one - zero))`` and ``p0 = softmax(zero)``.

    Monotone, so bisection is exact: with ``d = one - zero`` and
    ``A(t) = log sum_y p0(y) e^{t d_y}``, ``log q_t - log p0 = t d - A(t)``, so the radius is
    ``max(t max d - A(t), A(t) - t min d)``; both terms are 0 at ``t = 0`` and
    non-decreasing (their derivatives are ``max d - E_{q_t}[d] >= 0`` and
    ``E_{q_t}[d] - min d >= 0``). The feasible set is ``[0, lambda*]``. Vectorised bisection
    over shots with a fixed number of steps; the feasible (lower) end is returned and then
    re-checked, so the bound holds at the returned value whatever the rounding.
    """
    one, zero = _as_shots(one_shot_logits, zero_logits)
    if not (np.isfinite(eps0) and eps0 >= 0.0):
        raise ConfigurationError(
            f"max_log_ratio must be a finite number >= 0, got {eps0!r}",
            param="mechanism.max_log_ratio",
        )
    if not (np.isfinite(lam_max) and lam_max >= 0.0):
        raise ConfigurationError(
            f"lam_max must be a finite number >= 0, got {lam_max!r}",
            param="mechanism.lambda_max",
        )
    radius = float(eps0) * (1.0 - _RATIO_MARGIN)
    n_shots = one.shape[0]
    high = np.full(n_shots, float(lam_max), dtype=np.float64)
    low = np.zeros(n_shots, dtype=np.float64)
    done = _ratio_rows(high, one, zero) <= radius
    low[done] = high[done]
    for _ in range(_BISECTION_STEPS):
        if done.all():
            break
        mid = 0.5 * (low + high)
        ok = _ratio_rows(mid, one, zero) <= radius
        low = np.where(done | ~ok, low, mid)
        high = np.where(done | ok, high, mid)
    # Safety net: the returned lambda must satisfy the bound as evaluated for release.
    low[_ratio_rows(low, one, zero) > radius] = 0.0
    return low


# --------------------------------------------------------------------------- one step


@dataclass(frozen=True, slots=True)
class MozoStep:
    """One token of Algorithm 1.

    ``token_id`` is ``top_ids[j]`` for the sampled position ``j``; ``lambdas`` (``(n_shots,)``)
    are the mixing weights; ``log_ratios`` (``(n_shots,)``) each mixed distribution's
    ``max_y |log q(y) - log p0(y)|`` (``<= eps0`` in the proven mode); ``divergences``
    (``(n_shots, 2)``, paper mode only, else ``None``) are
    ``(D_alpha(mixed || zero), D_alpha(zero || mixed))`` (each ``<= beta * alpha``);
    ``mixed_probs`` (``(n_shots, k)``) the mixed distributions, ``zero_probs`` (``(k,)``) the
    zero-shot distribution and ``product_probs`` (``(k,)``) the distribution the token was
    drawn from, all on the top-k support in the order of ``top_ids``.
    """

    token_id: int
    lambdas: FloatArray
    log_ratios: FloatArray
    divergences: FloatArray | None
    mixed_probs: FloatArray
    zero_probs: FloatArray
    product_probs: FloatArray
    top_ids: IntArray


def mozo_step(
    one_shot_logits: npt.ArrayLike,
    zero_logits: npt.ArrayLike,
    top_ids: npt.ArrayLike,
    beta: float | None,
    alpha: float | None,
    rng: np.random.Generator,
    *,
    lam_max: float = DEFAULT_LAMBDA_MAX,
    eps0: float | None = None,
) -> MozoStep:
    """Lines 8-16 of Algorithm 1 for logits already restricted to the public top-k ids
    ``top_ids``: solve the lambdas, mix, multiply, sample. With ``eps0`` given the lambdas
    satisfy the proven mode's max-log-ratio constraint (``beta`` and ``alpha`` unused);
    otherwise the paper's Renyi constraint at ``(beta, alpha)``. Shot sampling (Line 3) is
    :func:`sample_shots`, done by the caller before computing the one-shot logits.

    A shot whose one-shot logits are not finite on the support (the model's numerics failed
    on its private prompt) is answered by the zero-shot logits, as an over-long shot prompt
    is (q_i = p0): still a function of that shot alone, where an error would release
    whether some shot's numerics failed. Non-finite zero-shot logits (a public prompt) are
    an error."""
    zero = np.asarray(zero_logits, dtype=np.float64)
    raw = np.asarray(one_shot_logits, dtype=np.float64)
    if raw.ndim == 2 and zero.ndim == 1 and raw.shape[1:] == zero.shape:
        raw = np.where(np.isfinite(raw).all(axis=1, keepdims=True), raw, zero)
    one, zero = _as_shots(raw, zero)
    ids = np.asarray(top_ids, dtype=np.int64)
    if ids.shape != zero.shape:
        raise ValueError(f"top_ids has shape {ids.shape}, the logits have k={zero.shape[0]}")
    divergences: FloatArray | None = None
    if eps0 is not None:
        lambdas = solve_lambdas_max_ratio(one, zero, eps0, lam_max)
        mixed = mixed_logits(one, zero, lambdas)
    else:
        if beta is None or alpha is None:
            raise ValueError("the paper mode needs beta and alpha (or pass eps0)")
        lambdas = solve_lambdas(one, zero, beta, alpha, lam_max)
        mixed = mixed_logits(one, zero, lambdas)
        divergences = symmetric_divergence(mixed, zero, alpha)
    log_mixed = log_softmax(mixed)
    log_zero = log_softmax(zero)
    product = product_distribution(mixed)
    position = sample_token(product, rng)
    return MozoStep(
        token_id=int(ids[position]),
        lambdas=lambdas,
        log_ratios=max_log_ratio(log_mixed, log_zero),
        divergences=divergences,
        mixed_probs=np.exp(log_mixed),
        zero_probs=np.exp(log_zero),
        product_probs=product,
        top_ids=ids,
    )
