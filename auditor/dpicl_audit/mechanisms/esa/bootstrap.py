"""ESA's bootstrap (paper 000, Algorithm 1 over embeddings): resample the collected clean
means, add noise of the measured-or-reported sigma (a chi-square check on the residuals),
attack, bound (:func:`.simulation.bootstrap_esa_audit`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dpicl_audit.estimators.power import flip_rate_from_signals
from dpicl_audit.jsontypes import json_float, json_int
from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.mechanisms.esa.design import GenerationDesign
from dpicl_audit.mechanisms.esa.estimates import (
    esa_setting_conformance,
    signal_reference,
    signal_tightness,
)
from dpicl_audit.mechanisms.esa.settings import EsaSettings
from dpicl_audit.mechanisms.esa.simulation import bootstrap_esa_audit
from dpicl_audit.mechanisms.trial_estimates import with_verdict
from dpicl_audit.plan.schedule import STREAM_BOOTSTRAP
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.store import TrialRecord

__all__ = ["estimate_esa_bootstrap"]


def _measured_sigma(
    rows: Sequence[TrialRecord], reported: float, confidence: float
) -> dict[str, Any]:
    """The noise actually added (noisy - clean mean, every coordinate) against the reported
    sigma: a chi-square interval on sigma from the residual sum of squares."""
    from scipy.stats import chi2

    ss = sum(json_float(r.observation.get("residual_ss", 0.0)) for r in rows)
    df = sum(json_int(r.observation.get("dim", 0)) for r in rows)
    if df == 0:
        return {
            "df": 0,
            "sigma_reported": reported,
            "simulation_sigma": reported,
            "status": "unchecked",
            "flagged": False,
            "message": "no noisy/clean pairs: the reported sigma is used unchecked",
        }
    alpha = 1.0 - confidence
    lo = math.sqrt(ss / float(chi2.ppf(1.0 - alpha / 2.0, df)))
    hi = math.sqrt(ss / float(chi2.ppf(alpha / 2.0, df)))
    consistent = lo <= reported <= hi
    status = "consistent" if consistent else ("smaller" if hi < reported else "larger")
    ci = f"[{lo:.4g}, {hi:.4g}] at {confidence:g} confidence from {df} residuals"
    message = {
        "consistent": f"the reported sigma {reported:.4g} lies in the real sigma's interval {ci}",
        "smaller": f"NOISE SMALLER THAN CLAIMED: the server reports sigma {reported:.4g} but "
        f"its debug residuals put the real sigma in {ci}",
        "larger": f"noise larger than claimed: reported sigma {reported:.4g}, real sigma in {ci}",
    }[status]
    return {
        "df": df,
        "sigma_reported": reported,
        "sigma_measured": math.sqrt(ss / df),
        "sigma_interval": [lo, hi],
        "consistent": consistent,
        # Like the voting noise check's (noise_check.py): "smaller" decides the verdict
        # (NONCONFORMING, mechanisms.conformance_checks).
        "status": status,
        "flagged": status == "smaller",
        "message": message,
        # The simulation trusts the reported sigma only if the real noise agrees with it;
        # otherwise it uses the measured noise's upper end (the conservative choice).
        "simulation_sigma": reported if consistent or hi > reported else hi,
    }


def estimate_esa_bootstrap(s: SettingRows) -> SettingResult:
    """Algorithm 1 for ESA: resample the collected clean means, add noise, attack, bound."""
    plan, k, clean, claims = s.plan, s.k, s.rows, s.claims
    design: GenerationDesign = s.design

    with_rows = [r.observation["clean_mean"] for r in clean if r.world == 1]
    without_rows = [r.observation["clean_mean"] for r in clean if r.world == 0]
    n_sample = plan.bootstrap.n_sample
    calls = EsaSettings.of(plan).partitions + EsaSettings.of(plan).candidates
    # The setting's claims, then the bootstrap's.
    out = SettingResult.of(
        **claims.to_json()
        | {
            "n_llm": len(with_rows),
            "n_sample": n_sample,
            "trials": 2 * n_sample,
            "llm_calls": len(clean) * calls,
            "positive": design.y1,
            "negative": design.y0,
        }
    )
    emb = design.signal_embeddings()
    if not with_rows or not without_rows or claims.sigma is None or emb is None:
        failed = Estimate.of(
            error="no clean means collected" if emb is not None else "no signal embeddings"
        )
        return out.updated(black_box=failed, white_box=failed)
    ids = claims.context_id_set()
    check = _measured_sigma([r for r in clean if r.context_id in ids], claims.sigma, 0.999)
    sigma_sim = float(check["simulation_sigma"])
    c1, c0 = np.array(with_rows, dtype=np.float64), np.array(without_rows, dtype=np.float64)
    out = out.updated(
        noise_check=check,
        sigma_simulated=sigma_sim,
        clean_shift=float(np.linalg.norm(c1.mean(axis=0) - c0.mean(axis=0))),
    )
    res = bootstrap_esa_audit(
        c1,
        c0,
        sigma_sim,
        n_sample,
        e_pos=emb[0],
        e_neg=emb[1],
        delta=plan.mechanism.delta,
        confidence=plan.confidence,
        rng=np.random.default_rng([plan.seed, STREAM_BOOTSTRAP, k]),
        fraction=plan.split,
        calls_per_row=calls,
    ).to_dict()
    rates, flips = _observed_rates(c1, c0, emb[0], emb[1], sigma_sim)
    ref = signal_reference(replace(claims, release_rates=rates, flip_rate=flips))
    out = out.updated(
        release_rates_observed=list(rates),
        flip_rate=flips,
        **{
            threat: signal_tightness(with_verdict(Estimate.of(**res[threat]), ref), claims)
            for threat in ("black_box", "white_box")
        },
    )
    return esa_setting_conformance(out, clean, claims, design, plan.seed, bootstrap=True)


def _observed_rates(
    c1: np.ndarray, c0: np.ndarray, e1: np.ndarray, e0: np.ndarray, sigma: float
) -> tuple[tuple[float, float], float]:
    """The simulated black-box rule's rates averaged over the collected clean means
    (``Phi(<c - (e1 + e0)/2, u> / sigma)``, u the unit vector along e1 - e0: both signal
    texts among the candidates, as simulated; mechanisms.esa.build), and the fraction of
    row-aligned pairs whose clean means differ."""
    from scipy import special

    diff = e1 - e0
    d = float(np.linalg.norm(diff))
    if d == 0.0:
        return (0.5, 0.5), 0.0
    u, mid = diff / d, (e1 + e0) / 2.0
    p1, p0 = (float(np.mean(special.ndtr((rows - mid) @ u / sigma))) for rows in (c1, c0))
    n = min(len(c1), len(c0))
    return (p1, p0), flip_rate_from_signals(c1[:n], c0[:n])
