"""ESA's privacy figures, its trials' estimates and its conformance tests.

* :func:`esa_claims`: epsilon_exact for the worst-case shift 2/T (or 1) and
  ``epsilon_exact_signal`` for the shift the canary actually causes, ``||e(y1) - e(y0)|| / T``;
* :func:`signal_tightness`: how a bound compares with the latter;
* :func:`esa_conformance`: the noise of the mean embedding ``noisy - clean`` per dimension and
  along fixed directions (the signal direction, the all-ones one, seeded random ones); on a
  bootstrap also a noise check that says "smaller than claimed" (NONCONFORMING: noise scale);
  a real run's released texts, each world's in trial order, against exchangeability
  (model-free: :mod:`dpicl_audit.estimators.exchangeable`).

The bootstrap's estimates are :mod:`.bootstrap`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dpicl_audit.claims import SettingClaims, number
from dpicl_audit.estimators.conformance import ConformanceTest, residual_tests
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.mechanisms.esa.build import release_epsilon_claims
from dpicl_audit.mechanisms.esa.design import GenerationDesign
from dpicl_audit.mechanisms.esa.exact import esa_epsilon_exact, esa_mean_sensitivity
from dpicl_audit.mechanisms.esa.facts import EsaFacts
from dpicl_audit.mechanisms.esa.settings import EsaSettings
from dpicl_audit.mechanisms.gaussian import GaussianFacts
from dpicl_audit.mechanisms.trial_estimates import (
    estimate_trials,
    finish_conformance,
    released_answers,
    with_verdict,
)
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import STREAM_ORDER
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.store import TrialRecord

__all__ = [
    "esa_claims",
    "esa_conformance",
    "esa_setting_conformance",
    "estimate_esa_trials",
    "signal_reference",
    "signal_tightness",
]

#: Seeded random directions for ESA's joint scale test (plus the signal and all-ones ones).
_N_RANDOM_DIRECTIONS = 8


def esa_claims(plan: AuditPlan, design: GenerationDesign, claims: SettingClaims) -> SettingClaims:
    """ESA's claims from the Gaussian ones: its facts (:class:`~.facts.EsaFacts`),
    epsilon_exact (worst-case shift) and epsilon_exact_signal (the actual shift)."""

    settings, delta = EsaSettings.of(plan), claims.delta
    sens = esa_mean_sensitivity(settings.partitions, original=settings.sensitivity == "original")
    base = claims.own(GaussianFacts)
    facts = EsaFacts(
        base.partitions,
        base.calibration,
        design.layout,
        sensitivity_bound=sens,
        signal=design.signal,
        signal_distance=design.signal_distance(),
    )
    claims = replace(claims, facts=facts, nulls=claims.nulls | {"epsilon_exact_signal"})
    sigma, shift = claims.sigma, facts.signal_shift
    if sigma is not None:
        claims = replace(
            claims,
            epsilon_exact=esa_epsilon_exact(sigma, sens, delta),
            epsilon_exact_signal=None if shift is None else esa_epsilon_exact(sigma, shift, delta),
        )
    if design.attack == "inquery":
        # The released candidate's closed-form rates at the design's intended clean gaps,
        # fair-coin zero-shot candidates (mechanisms.esa.build): the black-box ceiling.
        claims = release_epsilon_claims(claims, settings.candidates)
    return claims


def estimate_esa_trials(s: SettingRows, calls_per_query: int) -> SettingResult:
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
    plan, k, rows, claims = s.plan, s.k, s.rows, s.claims
    design: GenerationDesign = s.design
    from scipy.stats import beta

    power = claims
    note: JsonObject = {}
    rates = claims.release_rates
    if rows and design.attack == "inquery" and rates is not None:
        n = len(rows)
        sig = [design.signal_text(str(r.observation.get("text", ""))) for r in rows]
        k1, k0 = sig.count(design.y1), sig.count(design.y0)
        n1 = sum(1 for r in rows if r.world == 1)
        f1 = (n1 * rates[0] + (n - n1) * rates[1]) / n
        w = 1.0
        for k_obs, f in ((k1, f1), (k0, 1.0 - f1)):
            upper = 1.0 if k_obs == n else float(beta.ppf(0.975, k_obs + 1, n - k_obs))
            if f > 0.0:
                w = min(w, upper / f)
        power = replace(claims, release_rates=(w * rates[0], w * rates[1]))
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
    return esa_setting_conformance(
        out.updated(**note), rows, claims, design, plan.seed, bootstrap=False
    )


def esa_setting_conformance(
    out: SettingResult,
    rows: Sequence[TrialRecord],
    claims: SettingClaims,
    design: GenerationDesign,
    seed: int,
    *,
    bootstrap: bool,
) -> SettingResult:
    """The setting's conformance tests (:func:`esa_conformance`), read into its verdicts; a
    bootstrap's rows are the whole clean log, so the setting's own are taken."""
    if bootstrap:
        ids = claims.context_id_set()
        rows = [r for r in rows if r.context_id in ids]
    emb = design.signal_embeddings()
    signal = None if emb is None else (emb[0], emb[1])
    return esa_conformance(out, rows, claims, signal=signal, seed=seed, bootstrap=bootstrap)


def signal_reference(claims: SettingClaims) -> SettingClaims:
    """The claims a verdict reads: on the simulator, whose canary partition outputs exactly the
    design's signal texts, the design's own exact epsilon ``epsilon_exact_signal`` (the
    canary's actual shift ``D / T``) is the reference where it is below the worst case, so a
    bound above it is a BUG (issue 27); elsewhere the worst-case epsilon_exact (a real model's
    outputs may move the mean further)."""
    sig, exact = claims.epsilon_exact_signal, claims.epsilon_exact
    if not claims.simulator or sig is None or exact is None or sig >= exact:
        return claims
    # The signal's shift is itself a Gaussian mechanism: both figures are read against it;
    # power stays judged against the worst case.
    return claims.with_design_reference(sig, gaussian=True)


def signal_tightness(est: Estimate, claims: SettingClaims) -> Estimate:
    """Add how the bound compares with the exact epsilon of the canary's actual shift."""
    sig = claims.epsilon_exact_signal
    if sig is None:
        return est
    low = float(est.get("epsilon_lower"))
    return est.updated(
        ratio_to_exact_signal=low / sig if sig > 0 else None,
        exceeds_exact_signal=low > sig + 1e-3,
    )


def esa_conformance(
    out: SettingResult,
    rows: Sequence[TrialRecord],
    claims: SettingClaims,
    *,
    signal: tuple[np.ndarray, np.ndarray] | None,
    seed: int,
    bootstrap: bool = False,
) -> SettingResult:
    """ESA's conformance tests of one setting (module docstring)."""
    sigma = claims.sigma
    white: list[ConformanceTest] = []
    if bootstrap:
        check = out.noise_check or {}
        interval, df = check.get("sigma_interval"), check.get("df")
        if check.get("status") == "smaller":
            white += [
                ConformanceTest(
                    "noise scale",
                    "noise_check",
                    0.0,
                    (number(interval[1]) or 0.0) if isinstance(interval, list) else 0.0,
                    int(df) if isinstance(df, int | float) else 0,
                    str(check.get("message")),
                )
            ]
    res = [
        r
        for r in rows
        if isinstance(r.observation.get("residual"), list) and r.observation.get("residual")
    ]
    if res and sigma is not None:
        mat = np.array([r.observation["residual"] for r in res], dtype=np.float64)
        d = mat.shape[1]
        rng = np.random.default_rng([seed, 27])
        dirs = [np.ones(d), *rng.standard_normal((_N_RANDOM_DIRECTIONS, d))]
        if signal is not None and float(np.linalg.norm(signal[0] - signal[1])) > 0:
            dirs.insert(0, signal[0] - signal[1])
        white += residual_tests(
            mat, sigma, groups=[r.context_id for r in res], directions=np.array(dirs)
        )
    # The released texts' order (a real run's, not a bootstrap's clean rows): model-free.
    answers = None if bootstrap else released_answers(rows, "text")
    return finish_conformance(out, claims, [], white, answers=answers, seed=[seed, STREAM_ORDER])
