"""Power of an audit's figures: the model the verdicts read (the largest epsilon a figure
could reach at given trials, :mod:`~dpicl_audit.estimators.power`) and the trials it needs.

:func:`~dpicl_audit.verdicts.gaussian_verdict` grants a figure power when its reach is at
least half of epsilon_exact, and names the count that would do where it is not
(:func:`trials_for_power_of`); :mod:`~dpicl_audit.estimators.trial_budget` plans real runs with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators.family import FigureRecord, FigureTest
from dpicl_audit.estimators.gdp import gdp_mu
from dpicl_audit.estimators.power import (
    max_reachable_epsilon,
    reachable_from_rates,
    trials_for_power,
)
from dpicl_audit.estimators.verdict_rules import DEFAULT_MIN_POWER_FRACTION

__all__ = ["Reach", "exact_mus", "reach_model", "trials_for_power_of"]

Reach = Callable[[int, int], float]


def reach_model(
    est: FigureRecord, claims: SettingClaims, mu_exact: float | None
) -> tuple[Reach, tuple[int, int]] | None:
    """The largest epsilon this audit's design could reach at given trials per world
    (estimators.power), with the run's trials per world it is read at; None when the
    estimate has no counts.

    A figure of one test (black-box, bootstrap) is modelled at its counts and confidence:
    the black-box rule by its known release rates, else a score threshold (``flip_rate``,
    ``mu_exact``). A white-box figure is the better of two tests (estimators.whitebox), so
    its power is the better of theirs, each at its own share of the error: the black-box
    rule on all the trials and the held-out threshold on its part of them. It does not
    depend on which test won: the held-out one winning used to move the figure's power
    to the held-out counts, so a figure above the black-box one could lack the power the
    black-box figure of the same trials had.
    """

    n_pos, n_neg = est.get("n_pos"), est.get("n_neg")
    if not n_pos or not n_neg:
        return None
    delta, rates, flip = claims.delta, claims.release_rates, claims.flip_rate

    def test(part: FigureTest, runs: tuple[int, int], *, rule: bool) -> Reach:
        conf = float(part.get("confidence") or 0.95)
        if rule and rates is not None:  # the black-box rule, of known rates
            return lambda n_pos, n_neg: reachable_from_rates(
                n_pos, n_neg, float(rates[0]), float(rates[1]), delta=delta, confidence=conf
            )
        # A threshold on scores, on its share of the run's trials.
        share = (int(part.get("n_pos") or 0) / runs[0], int(part.get("n_neg") or 0) / runs[1])
        return lambda n_pos, n_neg: (
            max_reachable_epsilon(
                max(1, round(share[0] * n_pos)),
                max(1, round(share[1] * n_neg)),
                delta=delta,
                confidence=conf,
                flip_rate=1.0 if flip is None else float(flip),
                mu=math.inf if mu_exact is None else mu_exact,
                figure="gdp",
            ).epsilon
        )

    black, held = est.get("black_box"), est.get("held_out")
    if "chosen" not in est or not (black or held):
        runs = (int(n_pos), int(n_neg))
        return test(est, runs, rule=True), runs
    first: FigureTest = black or est
    runs = (int(first.get("n_pos") or 0), int(first.get("n_neg") or 0))
    tests = [
        test(part, runs, rule=part is black)
        for part in (black, held)
        if part and part.get("n_pos") and part.get("n_neg")
    ]
    return (lambda n_pos, n_neg: max(t(n_pos, n_neg) for t in tests)), runs


def exact_mus(claims: SettingClaims) -> tuple[float | None, float | None]:
    """mu of the mechanism's exact epsilon, and mu of what an attack on the canary can see
    at most (ESA: the canary's actual embedding shift; else the same)."""

    delta, exact, signal = claims.delta, claims.epsilon_exact, claims.epsilon_exact_signal
    mu_exact = None if exact is None else gdp_mu(exact, delta)
    return mu_exact, (mu_exact if signal is None else gdp_mu(signal, delta))


def trials_for_power_of(est: FigureRecord, claims: SettingClaims) -> tuple[int, int] | None:
    """About how many trials (with the canary, without, in the proportion of ``est``'s) the
    design of a Gaussian audit's figure ``est`` needs before
    :func:`~dpicl_audit.verdicts.gaussian_verdict` grants
    it power: a reachable bound of ``DEFAULT_MIN_POWER_FRACTION`` x epsilon_exact (or
    epsilon_theory). ``None``: no count up to ``MAX_SEARCHED_TRIALS`` does. A bootstrap's
    figure plans real trials this way: same design, same clean signals."""

    found = reach_model(est, claims, exact_mus(claims)[1])
    if found is None:
        raise InvalidAuditInput("the estimate has no trial counts (n_pos, n_neg)")
    model, (n_pos, n_neg) = found
    exact = claims.epsilon_exact
    reference = claims.epsilon_theory if exact is None else exact
    return trials_for_power(model, DEFAULT_MIN_POWER_FRACTION * reference, n_pos=n_pos, n_neg=n_neg)
