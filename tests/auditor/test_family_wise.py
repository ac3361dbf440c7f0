"""A run's VIOLATION and BUG claims hold for its figures together (estimators.family).

The figures are recomputed here from counts with ``estimate_from_counts`` at the stricter
level (a closed form per test), and the false-claim rate of the whole rule is checked by
simulation of a correct mechanism at its exact trade-off curve.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpicl_audit.claims import Family, SettingClaims
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import estimate_from_counts
from dpicl_audit.estimators.family import family_wise_figures, figure_tests
from dpicl_audit.estimators.gdp import gdp_epsilon
from dpicl_audit.estimators.rdp_audit import (
    DEFAULT_ORDERS,
    gaussian_rdp,
    k_cut_lower,
    two_cut_from_labels,
)
from dpicl_audit.estimators.whitebox import whitebox_estimate
from dpicl_audit.mechanisms.base import SettingRows
from dpicl_audit.mechanisms.dps_mozo.audit import MOZO
from dpicl_audit.mechanisms.voting.audit import VOTING
from dpicl_audit.mechanisms.voting.rdp import RdpDesign
from dpicl_audit.mechanisms.voting.rdp_estimates import estimate_rdp
from dpicl_audit.store import TrialRecord
from dpicl_audit.verdicts import gaussian_verdict
from tests.auditor.test_runner import _plan as _runner_plan

DELTA = 1e-5
CONF = 0.95


def setting(mu_exact: float, *, theory_factor: float = 2.0) -> SettingClaims:
    """A Gaussian claim whose exact value is ``mu_exact`` (its epsilon at DELTA) and whose
    claimed epsilon is ``theory_factor`` times that; full power (flip rate 1)."""
    exact = gdp_epsilon(mu_exact, DELTA)
    return SettingClaims(
        setting="eps", epsilon_theory=theory_factor * exact, delta=DELTA, epsilon_exact=exact,
        flip_rate=1.0,
    )  # fmt: skip


def black_box(tp: int, fn: int, fp: int, tn: int) -> dict[str, Any]:
    return estimate_from_counts(tp, fn, fp, tn, delta=DELTA, confidence=CONF).to_dict()


def test_a_black_box_figure_is_re_evaluated_at_the_stricter_level() -> None:
    est = black_box(80, 20, 22, 78)
    for m in (1, 2, 6):
        got = family_wise_figures(est, m, DELTA)
        ref = estimate_from_counts(80, 20, 22, 78, delta=DELTA, confidence=1 - (1 - CONF) / m)
        assert got is not None
        assert got.mu_lower == pytest.approx(ref.mu_lower, rel=1e-12)
        assert got.epsilon_lower_classic == pytest.approx(ref.epsilon_lower_classic, rel=1e-12)
    one, six = family_wise_figures(est, 1, DELTA), family_wise_figures(est, 6, DELTA)
    assert one is not None and six is not None
    assert one.mu_lower == pytest.approx(est["mu_lower"], rel=1e-12)
    assert six.mu_lower < one.mu_lower  # stricter level, lower bound
    with pytest.raises(InvalidAuditInput, match="size 0"):
        family_wise_figures(est, 0, DELTA)


def test_a_white_box_figure_keeps_the_better_of_its_two_tests() -> None:
    rng = np.random.default_rng(5)
    pos, neg = rng.normal(1.5, 1, 400), rng.normal(0, 1, 400)
    wb = whitebox_estimate(
        pos,
        neg,
        rng=rng,
        delta=DELTA,
        confidence=CONF,
        black_box_pos=pos > 0.75,
        black_box_neg=neg > 0.75,
    ).to_dict()
    tests = figure_tests(wb)
    assert len(tests) == 2 and {t["confidence"] for t in tests} != {CONF}  # shares of the error
    m = 4
    got = family_wise_figures(wb, m, DELTA)
    each = [
        estimate_from_counts(
            *(t[k] for k in ("tp", "fn", "fp", "tn")),
            delta=DELTA,
            confidence=1 - (1 - t["confidence"]) / m,
        )
        for t in tests
    ]
    assert got is not None
    assert got.mu_lower == pytest.approx(max(e.mu_lower for e in each), rel=1e-12)
    # Without counts nothing can be re-evaluated.
    assert family_wise_figures({"mu_lower": 1.0, "confidence": CONF}, m, DELTA) is None


def test_a_figure_that_exceeds_only_alone_is_inconclusive_for_the_run() -> None:
    # A tight design at mu_exact = 1 whose counts came out lucky: above mu_exact at 95% for
    # this figure alone, not for four figures together.
    meta = setting(1.0)
    est = black_box(153, 47, 47, 153)
    alone = gaussian_verdict(est, meta)
    assert alone.word == "BUG", alone
    assert alone.family_wise is None
    fw = family_wise_figures(est, 4, DELTA)
    assert fw is not None and fw.mu_lower < 1.0 < est["mu_lower"]
    run = gaussian_verdict(est, replace(meta, family=Family(4, CONF)))
    assert run.word == "INCONCLUSIVE" and run.status == "inconclusive"
    assert "not the run's 4 tests together" in run.message
    assert "up to 20% of runs" in run.message
    assert run.advice == ("run it again with more trials to tell",)
    assert run.family_wise is not None and run.family_wise["mu_lower"] == pytest.approx(fw.mu_lower)


def test_a_clear_violation_stands_for_the_run() -> None:
    meta = setting(0.5)  # claims epsilon of mu 0.5 x 2; the trials show far more
    est = black_box(190, 10, 10, 190)
    run = gaussian_verdict(est, replace(meta, family=Family(8, CONF)))
    assert run.word == "VIOLATION" and run.violation
    assert "holds for the run's 8 tests together at 95%" in run.message
    assert run.family_wise is not None and run.family_wise["size"] == 8


def test_without_counts_a_claim_cannot_stand_for_the_run() -> None:
    est = {"mu_lower": 3.0, "epsilon_lower_classic": 0.0, "confidence": CONF}
    run = gaussian_verdict(est, replace(setting(1.0), family=Family(2, CONF)))
    assert run.word == "INCONCLUSIVE"
    assert "counts are not in the estimate" in run.message


# ------------------------------------------------------------ paper 003's RDP sequences


RDP_SIGMA = 4.0


def _rdp_rows(a1: int, n: int) -> tuple[Any, list[TrialRecord]]:
    """One query asked n times per world; C1 releases label A a1 times, C0 n - a1 times."""
    design = SimpleNamespace(queries=("q",), labels=("A", "B"), poison_label="A")
    rows = [
        TrialRecord("s", i, w, f"c{w}", "q", {"label": lab}, None, 0.0)
        for w, a in ((1, a1), (0, n - a1))
        for i, lab in enumerate(["A"] * a + ["B"] * (n - a))
    ]
    return design, rows


def _rdp(a1: int, family: dict[str, Any] | None) -> dict[str, Any]:
    plan = _runner_plan(**{"mechanism.epsilons": [2.0], "confidence": CONF})
    design, rows = _rdp_rows(a1, 400)
    meta: dict[str, Any] = {"sigma": RDP_SIGMA, "epsilon_theory": 2.0}
    if family is not None:
        meta["family"] = family
    return estimate_rdp(plan, design, rows, SettingClaims.from_json(meta)).to_json()


def test_an_rdp_cut_that_exceeds_only_alone_is_inconclusive_for_the_run() -> None:
    # 265 of 400 against 135 of 400: the 2-cut at 95% crosses the Gaussian RDP of sigma 4
    # at some order, at 97.5% (one setting, two cuts) neither cut does (closed forms below).
    orders = np.asarray(DEFAULT_ORDERS)
    theory = gaussian_rdp(orders, RDP_SIGMA)
    c1, c0 = np.array([265, 135]), np.array([135, 265])
    assert np.any(two_cut_from_labels(c1, c0, 0, orders, confidence=CONF) > theory)
    strict = 1 - (1 - CONF) / 2
    for cut in (
        two_cut_from_labels(c1, c0, 0, orders, confidence=strict),
        k_cut_lower(c1, c0, orders, confidence=strict),
    ):
        assert np.all(cut <= theory)

    alone = _rdp(265, None)["verdict"]
    assert alone["status"] == "violation", alone
    run = _rdp(265, {"size": 2, "confidence": CONF})["verdict"]
    assert run["status"] == "inconclusive", run
    assert "not the run's 2 tests together" in run["message"]
    assert "up to 10% of runs" in run["message"]
    assert run["family_wise"]["confidence"] == pytest.approx(strict)
    # Recomposed from the label counts at the stricter level, not rescaled.
    assert run["family_wise"]["two_cut"] == pytest.approx(
        two_cut_from_labels(c1, c0, 0, orders, confidence=strict).tolist()
    )


def test_a_clear_rdp_violation_stands_for_the_run() -> None:
    run = _rdp(300, {"size": 6, "confidence": CONF})["verdict"]
    assert run["status"] == "violation" and run["violation"], run
    assert "holds for the run's 6 tests together at 95%" in run["message"]
    assert run["family_wise"]["confidence"] == pytest.approx(1 - (1 - CONF) / 6)


# ------------------------------------------------------------ DPS-MOZO's black-box figure


def _mozo_setting(tp: int, n: int, family: dict[str, Any], guarantee: str) -> dict[str, Any]:
    """A DPS-MOZO setting claiming epsilon 1 whose black-box rule said "with" tp of n times
    in C1 and n - tp of n times in C0."""
    plan = _runner_plan(
        **{
            "mechanism.name": "dps-mozo",
            "mechanism.epsilons": [1.0],
            "mechanism.exemplars": 3,
            "mechanism.guarantee": guarantee,
            "confidence": CONF,
        }
    )
    rows = [
        TrialRecord("s", i, w, f"c{w}", "q", {}, int(i < (tp if w else n - tp)), 0.0)
        for w in (1, 0)
        for i in range(n)
    ]
    meta = {"epsilon_theory": 1.0, "delta": plan.mechanism.delta, "family": family}
    claims = MOZO.claims_from_json(meta)
    return MOZO.estimate(SettingRows(plan, None, 0, rows, claims, False)).to_json()["black_box"]


@pytest.mark.parametrize(("guarantee", "tp"), [("proven", 388), ("paper", 300)])
def test_a_mozo_figure_that_exceeds_only_alone_is_inconclusive_for_the_run(
    guarantee: str, tp: int
) -> None:
    # Against the claimed epsilon 1, with n = 500 per world. Proven mode reads the classical
    # bound: 388 of 500 each way gives 1.03 at 95%, 0.985 with the error shared by three
    # settings. Paper mode (nominal) reads the larger of the GDP and classical figures:
    # 300 of 500 gives 1.047, and 0.848 shared by three.
    three = {"size": 3, "confidence": CONF}
    est = _mozo_setting(tp, 500, {"size": 1, "confidence": CONF}, guarantee)
    assert est["verdict"]["status"] == "violation", est["verdict"]
    assert est["epsilon_emp"] > 1.0
    run = _mozo_setting(tp, 500, three, guarantee)["verdict"]
    assert run["status"] == "inconclusive", run
    assert "not the run's 3 tests together" in run["message"]
    ref = estimate_from_counts(
        tp, 500 - tp, 500 - tp, tp, delta=est["delta"], confidence=1 - (1 - CONF) / 3
    )
    assert run["family_wise"]["epsilon_lower_classic"] == pytest.approx(ref.epsilon_lower_classic)
    assert run["family_wise"]["mu_lower"] == pytest.approx(ref.mu_lower)
    emp = (
        ref.epsilon_lower_classic
        if guarantee == "proven"
        else max(ref.epsilon_lower, ref.epsilon_lower_classic)
    )
    assert emp < 1.0
    clear = _mozo_setting(440, 500, three, guarantee)["verdict"]
    assert clear["status"] == "violation" and "3 tests together" in clear["message"]


def test_a_run_counts_the_tests_it_states_claims_from() -> None:
    both = ["black-box", "white-box"]
    assert VOTING.claims_per_setting(None, both) == 2
    assert VOTING.claims_per_setting(None, ["black-box"]) == 1
    rdp = object.__new__(RdpDesign)  # the two cuts, whatever the threat models
    assert VOTING.claims_per_setting(rdp, ["black-box"]) == 2
    assert MOZO.claims_per_setting(None, both) == 1  # white-box findings are not tests


# ------------------------------------------------------------ the rule's false-claim rate


def _false_claim_runs(
    rng: np.random.Generator, runs: int, figures: int, n: int, mu: float
) -> tuple[int, int]:
    """Runs of ``figures`` black-box figures on a correct mechanism (the optimal test of
    mu-GDP: FPR = FNR = Phi(-mu/2)) with any claim: read per figure alone, and for the run."""
    rate = float(stats.norm.cdf(-mu / 2))
    family = replace(setting(mu), family=Family(figures, CONF))
    alone = together = 0
    for _ in range(runs):
        fn = rng.binomial(n, rate, size=figures)
        fp = rng.binomial(n, rate, size=figures)
        verdicts = [
            gaussian_verdict(black_box(n - a, a, b, n - b), family)
            for a, b in zip(fn, fp, strict=True)
        ]
        # A figure is re-evaluated for the run exactly when it claimed something alone.
        alone += any(v.family_wise is not None for v in verdicts)
        together += any(v.flags for v in verdicts)
    return alone, together


@pytest.mark.slow
@pytest.mark.long
def test_a_correct_server_gets_a_false_claim_in_at_most_one_run_in_twenty() -> None:
    # 300 runs of 80 tight figures (n = 200 per world at mu = 1), like an audit over many
    # settings. The rule promises at most 5% of runs with a false claim; the check fails when
    # the count exceeds the 1 - 1e-4 quantile of Binomial(300, 0.05) (false-failure rate
    # <= 1e-4 for a correct rule). Read per figure alone, the same runs claim something in
    # about 14% of them (28 of 200 with this seed's first 200 runs, 0 for the run), so the
    # check has the power to fail a rule without the correction: it asserts that too.
    rng = np.random.default_rng(20261123)
    runs = 300
    alone, together = _false_claim_runs(rng, runs, figures=80, n=200, mu=1.0)
    limit = int(stats.binom.ppf(1 - 1e-4, runs, 0.05))
    assert together <= limit, (together, limit)
    assert alone > limit, (alone, limit)  # the per-figure reading would have failed
