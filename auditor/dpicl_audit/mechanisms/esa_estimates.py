"""ESA's privacy figures and its bootstrap (paper 000, Algorithm 1 over embeddings).

* :func:`esa_meta`: epsilon_exact for the worst-case shift 2/T (or 1) and
  ``epsilon_exact_signal`` for the shift the canary actually causes, ``||e(y1) - e(y0)|| / T``;
* :func:`signal_tightness`: how a bound compares with the latter;
* :func:`estimate_esa_bootstrap`: resample the collected clean means, add noise of the
  measured-or-reported sigma (a chi-square check on the residuals), attack, bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dpicl_audit.mechanisms.esa_designs import release_epsilon_meta
from dpicl_audit.mechanisms.trial_estimates import estimate_trials, with_verdict
from dpicl_audit.plan import AuditPlan
from dpicl_audit.schedule import STREAM_BOOTSTRAP
from dpicl_audit.store import TrialRecord

if TYPE_CHECKING:
    from dpicl_audit.mechanisms.esa import GenerationDesign

__all__ = [
    "esa_meta",
    "estimate_esa_bootstrap",
    "estimate_esa_trials",
    "signal_reference",
    "signal_tightness",
]


def esa_meta(
    plan: AuditPlan, design: GenerationDesign, meta: dict[str, Any], sigma: float | None
) -> dict[str, Any]:
    """ESA's epsilon_exact (worst-case shift) and epsilon_exact_signal (the actual shift)."""
    from dpicl_audit.estimators.exact import esa_epsilon_exact, esa_mean_sensitivity

    t = plan.mechanism.partitions
    sens = esa_mean_sensitivity(t, original=plan.mechanism.sensitivity == "original")
    dist = design.signal_distance()
    meta |= {
        "mechanism": "esa",
        "sensitivity_bound": sens,
        "signal": design.signal,
        "signal_distance": dist,
        "signal_shift": None if dist is None else dist / t,
        "epsilon_exact_signal": None,
        "design": design.layout,
    }
    if sigma is not None:
        meta["epsilon_exact"] = esa_epsilon_exact(sigma, sens, plan.mechanism.delta)
        if dist is not None:
            meta["epsilon_exact_signal"] = esa_epsilon_exact(sigma, dist / t, plan.mechanism.delta)
    if design.attack == "inquery":
        # The released candidate's closed-form rates at the design's intended clean gaps,
        # fair-coin zero-shot candidates (mechanisms.esa_designs): the black-box ceiling.
        meta |= release_epsilon_meta(
            design.layout, dist, t, sigma, plan.mechanism.candidates, plan.mechanism.delta
        )
    return meta


def estimate_esa_trials(
    plan: AuditPlan,
    design: GenerationDesign,
    k: int,
    rows: Sequence[TrialRecord],
    meta: dict[str, Any],
    calls_per_query: int,
) -> dict[str, Any]:
    """Real-query estimates; the black-box power counts only the signal releases observed.

    The design's release rates assume zero-shot candidates that are y1 or y0 by a fair coin
    (Prompt 3 asks for that). A model may answer something else (neither is released) or
    always the same text (greedy decoding: one signal text in both worlds). So the rates are
    scaled by ``w = min(1, U1 / f1, U0 / f0)``, where ``f1``, ``f0`` are the fractions of
    trials the design expects to release y1, y0 and ``U1``, ``U0`` the one-sided 97.5%
    Clopper-Pearson upper bounds of the observed fractions: a model that never releases one
    of the two gets a reachable bound near 0 and an INCONCLUSIVE verdict, never "consistent";
    an oracle that follows the design keeps ``w = 1`` except by chance.
    """
    from scipy.stats import beta

    power = dict(meta)
    note: dict[str, Any] = {}
    rates = meta.get("release_rates")
    if rows and design.attack == "inquery" and rates is not None:
        n = len(rows)
        sig = [design.signal_text(str(r.observation.get("text", ""))) for r in rows]
        k1, k0 = sig.count(design.y1), sig.count(design.y0)
        n1 = sum(1 for r in rows if r.world == 1)
        f1 = (n1 * float(rates[0]) + (n - n1) * float(rates[1])) / n
        w = 1.0
        for k_obs, f in ((k1, f1), (k0, 1.0 - f1)):
            upper = 1.0 if k_obs == n else float(beta.ppf(0.975, k_obs + 1, n - k_obs))
            if f > 0.0:
                w = min(w, upper / f)
        power["release_rates"] = [w * float(r) for r in rates]
        note = {
            "signal_releases": {"y1": k1, "y0": k0, "trials": n},
            "signal_release_weight": w,
        }
    out = estimate_trials(
        plan,
        k,
        rows,
        power,
        calls_per_query=calls_per_query,
        positive_when="below",
        finish=lambda est, m: signal_tightness(with_verdict(est, signal_reference(m)), m),
    )
    out |= note
    return _conformance(out, rows, meta, design, plan.seed, bootstrap=False)


def _conformance(
    out: dict[str, Any],
    rows: Sequence[TrialRecord],
    meta: Mapping[str, Any],
    design: GenerationDesign,
    seed: int,
    *,
    bootstrap: bool,
) -> dict[str, Any]:
    """The setting's conformance tests (mechanisms.conformance_checks), read into its
    verdicts; a bootstrap's rows are the whole clean log, so the setting's own are taken."""
    from dpicl_audit.mechanisms.conformance_checks import esa_conformance

    if bootstrap:
        ids = {cid for cid in meta["context_ids"].values() if cid is not None}
        rows = [r for r in rows if r.context_id in ids]
    emb = design.signal_embeddings()
    signal = None if emb is None else (emb[0], emb[1])
    return esa_conformance(out, rows, meta, signal=signal, seed=seed, bootstrap=bootstrap)


def signal_reference(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The meta a verdict reads: on the simulator, whose canary partition outputs exactly the
    design's signal texts, the design's own exact epsilon ``epsilon_exact_signal`` (the
    canary's actual shift ``D / T``) is the reference where it is below the worst case, so a
    bound above it is a BUG (issue 27); elsewhere the worst-case epsilon_exact (a real model's
    outputs may move the mean further)."""
    sig, exact = meta.get("epsilon_exact_signal"), meta.get("epsilon_exact")
    if not meta.get("simulator") or sig is None or exact is None or float(sig) >= float(exact):
        return dict(meta)
    # The signal's shift is itself a Gaussian mechanism: both figures are read against it;
    # power stays judged against the worst case.
    return dict(meta) | {"epsilon_exact_design": float(sig), "epsilon_exact_design_gaussian": True}


def signal_tightness(est: dict[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """Add how the bound compares with the exact epsilon of the canary's actual shift."""
    sig = meta.get("epsilon_exact_signal")
    low = float(est["epsilon_lower"])
    if sig is not None:
        est["ratio_to_exact_signal"] = low / sig if sig > 0 else None
        est["exceeds_exact_signal"] = low > float(sig) + 1e-3
    return est


def _measured_sigma(
    rows: Sequence[TrialRecord], reported: float, confidence: float
) -> dict[str, Any]:
    """The noise actually added (noisy - clean mean, every coordinate) against the reported
    sigma: a chi-square interval on sigma from the residual sum of squares."""
    from scipy.stats import chi2

    ss = sum(float(r.observation.get("residual_ss", 0.0)) for r in rows)
    df = sum(int(r.observation.get("dim", 0)) for r in rows)
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


def estimate_esa_bootstrap(
    plan: AuditPlan,
    design: GenerationDesign,
    k: int,
    clean: Sequence[TrialRecord],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Algorithm 1 for ESA: resample the collected clean means, add noise, attack, bound."""
    from dpicl_audit.bootstrap import bootstrap_esa_audit

    out = dict(meta)
    with_rows = [r.observation["clean_mean"] for r in clean if r.world == 1]
    without_rows = [r.observation["clean_mean"] for r in clean if r.world == 0]
    n_sample = plan.bootstrap.n_sample
    calls = plan.mechanism.partitions + plan.mechanism.candidates
    out |= {
        "n_llm": len(with_rows),
        "n_sample": n_sample,
        "trials": 2 * n_sample,
        "llm_calls": len(clean) * calls,
        "positive": design.y1,
        "negative": design.y0,
    }
    emb = design.signal_embeddings()
    if not with_rows or not without_rows or meta["sigma"] is None or emb is None:
        out["black_box"] = out["white_box"] = {
            "error": "no clean means collected" if emb is not None else "no signal embeddings"
        }
        return out
    ids = {cid for cid in meta["context_ids"].values() if cid is not None}
    check = _measured_sigma([r for r in clean if r.context_id in ids], float(meta["sigma"]), 0.999)
    out["noise_check"] = check
    sigma_sim = float(check["simulation_sigma"])
    out["sigma_simulated"] = sigma_sim
    c1, c0 = np.array(with_rows, dtype=np.float64), np.array(without_rows, dtype=np.float64)
    out["clean_shift"] = float(np.linalg.norm(c1.mean(axis=0) - c0.mean(axis=0)))
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
    power = dict(meta) | _observed_rates(c1, c0, emb[0], emb[1], sigma_sim)
    out["release_rates_observed"] = power["release_rates"]
    out["flip_rate"] = power["flip_rate"]
    ref = signal_reference(power)
    out["black_box"] = signal_tightness(with_verdict(res["black_box"], ref), meta)
    out["white_box"] = signal_tightness(with_verdict(res["white_box"], ref), meta)
    return _conformance(out, clean, meta, design, plan.seed, bootstrap=True)


def _observed_rates(
    c1: np.ndarray, c0: np.ndarray, e1: np.ndarray, e0: np.ndarray, sigma: float
) -> dict[str, Any]:
    """The simulated black-box rule's rates averaged over the collected clean means
    (``Phi(<c - (e1 + e0)/2, u> / sigma)``, u the unit vector along e1 - e0: both signal
    texts among the candidates, as simulated; mechanisms.esa_designs), and the fraction of
    row-aligned pairs whose clean means differ."""
    from scipy import special

    from dpicl_audit.estimators.power import flip_rate_from_signals

    diff = e1 - e0
    d = float(np.linalg.norm(diff))
    if d == 0.0:
        return {"release_rates": [0.5, 0.5], "flip_rate": 0.0}
    u, mid = diff / d, (e1 + e0) / 2.0
    rates = [float(np.mean(special.ndtr((rows - mid) @ u / sigma))) for rows in (c1, c0)]
    n = min(len(c1), len(c0))
    return {"release_rates": rates, "flip_rate": flip_rate_from_signals(c1[:n], c0[:n])}
