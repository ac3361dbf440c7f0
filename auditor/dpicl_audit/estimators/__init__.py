"""Estimators: from an attack's counts (or scores) to empirical privacy bounds.

* :mod:`.counts` the black-box estimate from an attack's confusion counts;
* :mod:`.stats` Clopper-Pearson bounds and how a joint confidence is split between intervals;
* :mod:`.gdp` the mu-GDP curve and the lower bound on mu (paper 000, Section 2);
* :mod:`.classic` the classical (epsilon, delta) lower bound (paper 003, Section 2.2);
* :mod:`.exact` the mechanisms' true curves (dp-accounting PLD) and theory noise levels;
* :mod:`.held_out` the split and held-out bound both white-box estimates share;
* :mod:`.thresholds` white-box threshold selection on one split, bounds on the other;
* :mod:`.rdp` Renyi-DP: exact divergence of noisy argmax and the 2-cut lower bound (003);
* :mod:`.label_release` exact epsilon of voting's released label; the pivotal canary design;
* :mod:`.whitebox` white-box bounds never weaker than black-box; both figures (GDP, classical);
* :mod:`.composition` the budget that holds q answers of an (epsilon, delta) claim;
* :mod:`.power` the largest epsilon a design could reach with its trials;
* :mod:`.figure_power` the power model the verdicts read; :mod:`.trial_budget` real trials
  under a time budget, spent where they can prove something;
* :mod:`.verdict_rules` VIOLATION / BUG / INCONCLUSIVE / CONSISTENT from the figures;
* :mod:`.family` a run's claims held for all of its tests together;
* :mod:`.conformance` whether the releases follow the mechanism the server reports;
  :mod:`.draws` whether sampled tokens were drawn from the distribution reported (DPS-MOZO);
  :mod:`.exchangeable` whether repeated answers to one query are in a random order;
* :mod:`.rdp_audit` paper 003's RDP audit of a query sequence; :mod:`.roc` ROC curves;
* :mod:`.bootstrap` Algorithm 1 of paper 000: estimates from simulated decisions and scores
  (each mechanism simulates its own), and :mod:`.noise_check` its guard
  (does the server add the noise it claims?);
* :mod:`.extra_fields` every response field besides the answer, tested for dependence on the
  neighbouring world given the answer; :mod:`.channels` refusals and response times, tested
  the same way (issue 44).

:func:`~.counts.estimate_from_counts` is the black-box estimator (it backs ``dpicl-audit
estimate``). This module only re-exports: no module of the package imports it back.
"""

from __future__ import annotations

from dpicl_audit.estimators.classic import classic_epsilon_from_rates, epsilon_lower_classic
from dpicl_audit.estimators.counts import MAX_COUNT, AuditEstimate, estimate_from_counts
from dpicl_audit.estimators.exact import (
    VOTING_SENSITIVITY,
    analytic_sigma,
    classic_sigma,
    gaussian_epsilon_exact,
)
from dpicl_audit.estimators.gdp import gdp_delta, gdp_epsilon, gdp_mu, mu_from_rates, mu_lower
from dpicl_audit.estimators.rdp import (
    noisy_argmax_log_probabilities,
    rdp_to_epsilon,
    rdp_two_cut_lower,
    renyi_noisy_argmax_exact,
)
from dpicl_audit.estimators.stats import (
    ConfidenceSplit,
    check_confidence,
    check_delta,
    clopper_pearson_lower,
    clopper_pearson_upper,
    per_interval_confidence,
)
from dpicl_audit.estimators.thresholds import (
    ThresholdChoice,
    ThresholdEstimate,
    choose_threshold,
    split_threshold_estimate,
)

__all__ = [
    "MAX_COUNT",
    "VOTING_SENSITIVITY",
    "AuditEstimate",
    "ConfidenceSplit",
    "ThresholdChoice",
    "ThresholdEstimate",
    "analytic_sigma",
    "check_confidence",
    "check_delta",
    "choose_threshold",
    "classic_epsilon_from_rates",
    "classic_sigma",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_classic",
    "estimate_from_counts",
    "gaussian_epsilon_exact",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "mu_from_rates",
    "mu_lower",
    "noisy_argmax_log_probabilities",
    "per_interval_confidence",
    "rdp_to_epsilon",
    "rdp_two_cut_lower",
    "renyi_noisy_argmax_exact",
    "split_threshold_estimate",
]
