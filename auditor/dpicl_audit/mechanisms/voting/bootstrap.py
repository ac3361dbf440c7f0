"""Private voting's bootstrap (paper 000, Algorithm 1): clean vote vectors resampled with
noise of the server's sigma, after the noise check (:mod:`dpicl_audit.estimators.noise_check`); the
simulation is :func:`.simulation.bootstrap_voting_audit`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dpicl_audit.catalog.settings import PartitionedSettings
from dpicl_audit.claims import SettingClaims
from dpicl_audit.mechanisms.trial_estimates import with_verdict
from dpicl_audit.mechanisms.voting.design import AuditDesign
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import STREAM_BOOTSTRAP
from dpicl_audit.results import Estimate, SettingResult
from dpicl_audit.store import TrialRecord

__all__ = ["estimate_voting_bootstrap"]


def estimate_voting_bootstrap(
    plan: AuditPlan,
    design: AuditDesign,
    k: int,
    clean: Sequence[TrialRecord],
    claims: SettingClaims,
) -> SettingResult:
    # slow imports: only when needed
    from dpicl_audit.estimators.noise_check import check_noise, residuals_from_observations
    from dpicl_audit.mechanisms.voting.simulation import bootstrap_voting_audit

    out = SettingResult.of(**claims.to_json())  # the setting's claims, then the bootstrap's
    with_rows = [design.clean_vector(r.observation["clean_votes"]) for r in clean if r.world == 1]
    without_rows = [
        design.clean_vector(r.observation["clean_votes"]) for r in clean if r.world == 0
    ]
    pos = design.labels.index(design.positive)
    if design.negative is not None:
        neg = design.labels.index(design.negative)
    else:  # Brainwash: the strongest competitor in the clean votes
        totals = np.sum(np.array(with_rows + without_rows, dtype=np.float64), axis=0)
        totals[pos] = -np.inf
        neg = int(np.argmax(totals))
    n_sample = plan.bootstrap.n_sample
    ids = claims.context_id_set()
    sigma_sim = claims.sigma
    if claims.sigma is not None:
        # The simulation trusts the reported sigma only if the real noise agrees with it.
        check = check_noise(
            residuals_from_observations(
                (r.observation for r in clean if r.context_id in ids), design.labels
            ),
            claims.sigma,
        )
        out = out.updated(noise_check=check.to_dict())
        sigma_sim = check.simulation_sigma
    out = out.updated(
        sigma_simulated=sigma_sim,
        n_llm=len(with_rows),
        n_sample=n_sample,
        trials=2 * n_sample,
        llm_calls=len(clean) * PartitionedSettings.of(plan).partitions,
        positive=design.positive,
        negative=design.labels[neg],
    )
    if not with_rows or not without_rows or sigma_sim is None:  # None: no sigma reported
        failed = Estimate.of(error="no clean votes collected")
        return out.updated(black_box=failed, white_box=failed)
    res = bootstrap_voting_audit(
        np.array(with_rows),
        np.array(without_rows),
        sigma_sim,
        n_sample,
        positive_index=pos,
        negative_index=neg,
        delta=plan.mechanism.delta,
        confidence=plan.confidence,
        rng=np.random.default_rng([plan.seed, STREAM_BOOTSTRAP, k]),
        fraction=plan.split,
        calls_per_row=PartitionedSettings.of(plan).partitions,
    ).to_dict()
    flips, rates = _observed_signal(
        np.array(with_rows), np.array(without_rows), pos, neg, sigma_sim
    )
    power = replace(claims, flip_rate=flips, release_rates=rates)
    return out.updated(
        flip_rate=flips,
        release_rates_observed=list(rates),
        black_box=with_verdict(Estimate.of(**res["black_box"]), power),
        white_box=with_verdict(Estimate.of(**res["white_box"]), power),
    )


def _observed_signal(
    with_rows: np.ndarray, without_rows: np.ndarray, pos: int, neg: int, sigma: float
) -> tuple[float, tuple[float, float]]:
    """What the clean votes say about the audit's power: the fraction of (row-aligned) pairs
    whose clean votes differ between worlds, and the black-box rule's release rates averaged
    over the collected votes (two-label closed form on the positive/negative counts)."""
    from scipy import special

    from dpicl_audit.estimators.power import flip_rate_from_signals

    n = min(len(with_rows), len(without_rows))
    flips = flip_rate_from_signals(with_rows[:n], without_rows[:n])
    scale = sigma * np.sqrt(2.0)
    p1, p0 = (
        float(np.mean(special.ndtr((rows[:, pos] - rows[:, neg]) / scale)))
        for rows in (with_rows, without_rows)
    )
    return flips, (p1, p0)
