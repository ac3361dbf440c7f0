"""The white-box check of DPS-MOZO's proven mode, recomputed by the auditor.

In the proven mode (docs/privacy.md, "DPS-MOZO, proven mode") the server claims, per
released token, on the released support S (the zero-shot top-k):

1. every shot's mixed distribution ``q_i`` stays within ``eps0`` (``max_log_ratio``) of the
   zero-shot distribution ``p0``: ``max_y |log q_i(y) - log p0(y)| <= eps0``;
2. hence the released distribution ``P ∝ prod_i q_i`` is pure ``per_token_epsilon``-DP under
   replace-one (``4 eps0``; ``2 eps0`` with one shot).

At ``DPICL_WHITEBOX=internal`` the debug endpoint reports ``zero_shot_probs``, each shot's
``mixed_probs`` and the ``product_probs`` the token was drawn from. This module recomputes,
from those probabilities alone and never from the server's own ``log_ratios``:

* ``radius``: ``max_i max_y |log q_i - log p0|`` (claim 1);
* ``exact``: the realised worst case ``max_i max_y |log P - log P_i|``, where ``P_i`` is the
  product with shot i replaced by ``p0`` (a neighbour whose exemplar moves nothing), beside
  the server's ``exact_log_ratios``; both must stay within ``per_token_epsilon`` (claim 2);
* ``product_gap``: ``max_y |log product_probs - log P|``: the distribution the server says
  it sampled from is the product of the mixed distributions it reports (else the reported
  internals are not what was released, and the check above proves nothing).

:func:`neighbour_gap` compares the first token's released distributions of C1 and C0 drawn
with the same shot set: the first token's prefix is the query alone, so these two are the
replace-one pair itself (conditionally on the shots, docs/privacy.md's theorem bounds them by
``per_token_epsilon`` too), not a stand-in neighbour.

Each probability vector is renormalised here before its logarithm is taken. Where both
sides of a ratio are exactly 0 (an underflow the server cannot release either) the ratio
counts as 0; a 0 against a positive probability is an infinite ratio. The auditor's own
numpy code, independent of the server's (DESIGN.md section 1).

:func:`token_internals` is what a white-box trial logs of a ``/v1/debug/generate`` answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import TargetProtocolError

__all__ = ["RATIO_TOL", "exceeds", "neighbour_gap", "token_check", "token_internals"]

#: Relative slack over a bound: the server aims at ``eps0 (1 - 1e-9)`` so that the ratios
#: recomputed from float64 probabilities (absolute error ~1e-15) never exceed eps0 by rounding.
RATIO_TOL = 1e-9

FloatArray = npt.NDArray[np.float64]


def exceeds(value: float | None, bound: float) -> bool:
    """Whether a recomputed ratio lies above its bound beyond rounding."""
    return value is not None and value > bound * (1 + RATIO_TOL) + 1e-12


def _log_probs(values: Any, what: str, k: int | None = None) -> FloatArray:
    try:
        p = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TargetProtocolError(f"/v1/debug/generate: {what} is not numeric") from exc
    if p.ndim == 0 or p.shape[-1] == 0 or (k is not None and p.shape[-1] != k):
        raise TargetProtocolError(f"/v1/debug/generate: {what} has shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise TargetProtocolError(f"/v1/debug/generate: {what} holds a negative or non-finite")
    total = p.sum(axis=-1, keepdims=True)
    if np.any(total <= 0):
        raise TargetProtocolError(f"/v1/debug/generate: {what} sums to 0")
    with np.errstate(divide="ignore"):
        return np.asarray(np.log(p / total), dtype=np.float64)


def _abs_gap(a: FloatArray, b: FloatArray) -> FloatArray:
    """``|a - b|`` of log-probabilities, 0 where both are ``-inf``."""
    both_zero = np.isneginf(a) & np.isneginf(b)
    with np.errstate(invalid="ignore"):
        gap = np.abs(a - b)
    return np.asarray(np.where(both_zero, 0.0, gap), dtype=np.float64)


def _log_normalise(log_w: FloatArray) -> FloatArray:
    """Log-softmax over the last axis; rows of all ``-inf`` stay ``-inf``."""
    top = np.max(log_w, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        lse = np.log(np.sum(np.exp(log_w - top), axis=-1, keepdims=True)) + top
    return np.asarray(log_w - lse, dtype=np.float64)


def token_check(tok: Mapping[str, Any]) -> dict[str, float | None]:
    """The auditor's figures for one released token (see the module docstring); ``None``
    for what the answer lacks (no probabilities below ``internal``)."""
    out: dict[str, float | None] = {
        "radius": None,
        "exact": None,
        "exact_server": _max_of(tok.get("exact_log_ratios")),
        "radius_server": _max_of(tok.get("log_ratios")),
        "product_gap": None,
    }
    zero, mixed = tok.get("zero_shot_probs"), tok.get("mixed_probs")
    if zero is None or mixed is None:
        return out
    log_p0 = _log_probs(zero, "zero_shot_probs")
    if log_p0.ndim != 1:
        raise TargetProtocolError(f"/v1/debug/generate: zero_shot_probs has shape {log_p0.shape}")
    log_q = _log_probs(mixed, "mixed_probs", k=log_p0.shape[0])
    if log_q.ndim != 2:
        raise TargetProtocolError(f"/v1/debug/generate: mixed_probs has shape {log_q.shape}")
    out["radius"] = float(np.max(_abs_gap(log_q, log_p0[None, :])))
    total = log_q.sum(axis=0)
    log_p = _log_normalise(total)
    # P_i: shot i's factor replaced by p0 (computed without subtracting -inf from -inf).
    others = np.stack([np.delete(log_q, i, axis=0).sum(axis=0) for i in range(log_q.shape[0])])
    log_pi = _log_normalise(others + log_p0[None, :])
    out["exact"] = float(np.max(_abs_gap(log_pi, log_p[None, :])))
    if tok.get("product_probs") is not None:
        reported = _log_probs(tok["product_probs"], "product_probs", k=log_p0.shape[0])
        out["product_gap"] = float(np.max(_abs_gap(reported, log_p)))
    return out


def neighbour_gap(probs_1: Sequence[float], probs_0: Sequence[float]) -> float:
    """``max_y |log P1(y) - log P0(y)|`` of two released distributions on one support."""
    log_1 = _log_probs(probs_1, "product_probs")
    return float(np.max(_abs_gap(log_1, _log_probs(probs_0, "product_probs", k=log_1.shape[0]))))


def _max_of(values: Sequence[Any] | None) -> float | None:
    if not values:
        return None
    try:
        return float(max(float(v) for v in values))
    except (TypeError, ValueError) as exc:
        raise TargetProtocolError("/v1/debug/generate: a per-shot ratio is not numeric") from exc


def token_internals(out: Mapping[str, Any], guarantee: str) -> dict[str, Any]:
    """The white-box observation. Proven mode: per token the lambdas and the auditor's own
    :func:`~dpicl_audit.mechanisms.dps_mozo.check.token_check` figures (not the probabilities,
    which would make the log ~1 kB per token and shot). Paper mode: per-token lambdas and
    divergences (and, at internal, the exact per-shot divergences)."""
    tokens = out.get("tokens")
    if not isinstance(tokens, list):
        raise TargetProtocolError("/v1/debug/generate returned no DPS-MOZO tokens[]")
    got = out.get("guarantee", "paper")
    if got != guarantee:
        raise TargetProtocolError(
            f"/v1/debug/generate reports guarantee {got!r}, the audit asked for {guarantee!r}"
        )
    kept = []
    first: dict[str, Any] | None = None
    for tok in tokens:
        if not isinstance(tok, Mapping):
            raise TargetProtocolError("/v1/debug/generate: a tokens[] entry is not an object")
        if first is None and tok.get("shots") is not None and tok.get("product_probs"):
            # The first token's released distribution and shot set: C1 and C0 answers drawn
            # with the same shots are then the replace-one pair itself (mozo_findings).
            first = {
                "shots": sorted(int(i) for i in tok["shots"]),
                "top_ids": tok.get("top_ids"),
                "product_probs": tok["product_probs"],
            }
        if guarantee == "proven":
            kept.append({"token_id": tok.get("token_id"), "lambdas": tok.get("lambdas")})
            kept[-1] |= token_check(tok)
            continue
        kept.append(
            {
                key: tok.get(key)
                for key in ("token_id", "lambdas", "divergences", "exact_divergences")
                if tok.get(key) is not None
            }
        )
    return {
        "tokens": kept,
        "first_token": first if guarantee == "proven" and kept else None,
        "whitebox": out.get("whitebox"),
        "alpha": out.get("alpha"),
        "beta": out.get("beta"),
        "max_log_ratio": out.get("max_log_ratio"),
        "radius": out.get("radius"),
        "per_token_bound": out.get("per_token_bound"),
        "max_exact_divergence": out.get("max_exact_divergence"),
        "max_exact_log_ratio": out.get("max_exact_log_ratio"),
    }
