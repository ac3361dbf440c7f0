"""How many trials an audit needs for power (estimators.power.trials_for_power), the advice
of an underpowered verdict, and the demo's budget of real trials (trial_budget)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.claims import SettingClaims
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.estimators import estimate_from_counts, gdp_epsilon
from dpicl_audit.estimators.figure_power import trials_for_power_of
from dpicl_audit.estimators.power import max_reachable_epsilon, trials_for_power
from dpicl_audit.estimators.trial_budget import (
    POWER_MARGIN,
    needs_from_bootstrap,
    plan_trials,
    trials_from_bootstrap,
)
from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
from dpicl_audit.verdicts import gaussian_verdict

DELTA = 1e-5


def gdp_reach(mu: float, flip: float = 1.0) -> Any:
    def reach(n_pos: int, n_neg: int) -> float:
        return max_reachable_epsilon(
            n_pos, n_neg, delta=DELTA, mu=mu, flip_rate=flip, figure="gdp"
        ).epsilon

    return reach


@pytest.mark.parametrize(("mu", "fraction"), [(1.65, 0.5), (0.83, 0.5), (2.5, 0.7)])
def test_the_count_found_is_the_first_that_reaches(mu: float, fraction: float) -> None:
    reach = gdp_reach(mu)
    target = fraction * gdp_epsilon(mu, DELTA)
    got = trials_for_power(reach, target, n_pos=1, n_neg=1)
    assert got is not None and got[0] == got[1]
    n = got[0]
    assert reach(n, n) >= target
    # A scan of every balanced count up to it: the first that reaches lies at most 10%
    # below (the reach wiggles with the rounding of its expected counts, so the bisection
    # can land on a later crossing: 122 against 116 at mu 2.5), and 10% fewer never reach.
    first = next(k for k in range(1, n + 1) if reach(k, k) >= target)
    assert first <= n <= math.ceil(1.1 * first)
    assert reach(int(0.9 * n), int(0.9 * n)) < target


def test_the_count_keeps_the_proportion_of_the_worlds() -> None:
    got = trials_for_power(gdp_reach(1.65), 3.9, n_pos=100, n_neg=300)
    assert got is not None
    pos, neg = got
    assert neg / pos == pytest.approx(3.0, rel=0.05)
    assert gdp_reach(1.65)(pos, neg) >= 3.9


def test_already_powered_counts_get_a_smaller_answer() -> None:
    reach = gdp_reach(1.65)
    got = trials_for_power(reach, 3.9, n_pos=5000, n_neg=5000)
    assert got is not None and sum(got) < 10_000 and reach(*got) >= 3.9


def test_no_count_reaches_without_signal_or_past_the_mechanism() -> None:
    # No flips: every count reaches 0. Past the mechanism's own epsilon: the reach only
    # approaches it (test_power_verdicts), so no count within the search does.
    assert trials_for_power(gdp_reach(1.65, flip=0.0), 0.5, n_pos=1, n_neg=1) is None
    beyond = 1.01 * gdp_epsilon(1.0, DELTA)
    assert trials_for_power(gdp_reach(1.0), beyond, n_pos=1, n_neg=1, max_trials=10**6) is None


@pytest.mark.parametrize(
    "bad",
    [{"target": math.nan}, {"n_pos": 0}, {"n_neg": 1.5}, {"max_trials": 0}],
)
def test_trials_for_power_rejects_bad_input(bad: dict[str, Any]) -> None:
    kw: dict[str, Any] = {"target": 1.0, "n_pos": 1, "n_neg": 1} | bad
    target = kw.pop("target")
    with pytest.raises(InvalidAuditInput):
        trials_for_power(gdp_reach(1.0), target, **kw)


def setting(mu_exact: float) -> dict[str, Any]:
    exact = gdp_epsilon(mu_exact, DELTA)
    return {"epsilon_theory": 2 * exact, "epsilon_exact": exact, "delta": DELTA}


def test_an_underpowered_verdict_names_a_count_that_has_power() -> None:
    meta = setting(1.65)
    est = estimate_from_counts(40, 10, 12, 38, delta=DELTA).to_dict()
    v = gaussian_verdict(est, SettingClaims.from_json(meta))
    assert v.word == "INCONCLUSIVE" and v.trials_needed is not None, v
    pos, neg = v.trials_needed
    assert pos == neg and pos + neg > 100
    assert f"about {pos + neg:,} in all ({pos:,} with the canary, {neg:,} without)" in (v.message)
    assert (pos, neg) == trials_for_power_of(est, SettingClaims.from_json(meta))
    # The same rates at the named counts: the verdict has its power and decides.
    scaled = estimate_from_counts(
        round(0.8 * pos), pos - round(0.8 * pos), round(0.24 * neg), neg - round(0.24 * neg),
        delta=DELTA,
    ).to_dict()  # fmt: skip
    again = gaussian_verdict(scaled, SettingClaims.from_json(meta))
    assert again.word == "CONSISTENT" and again.trials_needed is None
    assert again.max_reachable >= 0.5 * meta["epsilon_exact"]


def test_an_unreachable_need_says_so() -> None:
    meta = setting(1.65) | {"flip_rate": 0.001}
    est = estimate_from_counts(40, 10, 12, 38, delta=DELTA).to_dict()
    v = gaussian_verdict(est, SettingClaims.from_json(meta))
    assert v.word == "INCONCLUSIVE" and v.trials_needed is None
    assert "more trials will not do" in v.message


def bootstrap_results(*mus: float) -> dict[str, Any]:
    """A bootstrap's results: per setting, black-box and white-box figures on many trials."""
    settings = []
    for mu in mus:
        meta = setting(mu)
        est = estimate_from_counts(900, 100, 300, 700, delta=DELTA).to_dict()
        settings.append(meta | {"black_box": est, "white_box": dict(est, n_pos=500, n_neg=500)})
    return {"settings": settings}


def test_needs_from_a_bootstrap_cover_the_stricter_white_box_figure() -> None:
    res = bootstrap_results(0.83, 1.65)
    plan = {"confidence": 0.95, "split": 0.5}
    needs = needs_from_bootstrap(res["settings"], **plan)
    plain = needs_from_bootstrap(res["settings"], **plan, margin=1.0)
    # A larger share for the selection leaves the held-out threshold fewer trials: never less.
    assert all(
        (n or 0) >= (plain[e] or 0)
        for e, n in needs_from_bootstrap(
            res["settings"], confidence=0.95, split=0.8, margin=1.0
        ).items()
    )
    for s in res["settings"]:
        eps = s["epsilon_theory"]
        black = trials_for_power_of(
            s["black_box"], SettingClaims.from_json(s)
        )  # the black-box figure alone, at 95%
        assert black is not None
        # The white-box figure's tests run at 98.75% each: it needs more than the black-box
        # figure, and the plan covers it, with the margin on top.
        assert plain[eps] is not None and plain[eps] > sum(black)
        assert needs[eps] == math.ceil(POWER_MARGIN * plain[eps])
    assert needs[res["settings"][0]["epsilon_theory"]] > needs[res["settings"][1]["epsilon_theory"]]
    res["settings"][0]["flip_rate"] = 0.0
    assert (
        needs_from_bootstrap(res["settings"], **plan)[res["settings"][0]["epsilon_theory"]] is None
    )
    del res["settings"][1]["black_box"]["n_pos"]
    assert (
        needs_from_bootstrap(res["settings"], **plan)[res["settings"][1]["epsilon_theory"]] is None
    )
    for bad in ({"margin": 0.5}, {"split": 1.0}, {"confidence": 1.5}):
        with pytest.raises(InvalidAuditInput):
            needs_from_bootstrap(res["settings"], **(plan | bad))


@pytest.mark.parametrize(
    ("needs", "budget", "expected"),
    [
        # the cheap need fits and takes the rest of the budget; the other keeps the minimum
        ({4.0: 520, 8.0: 210}, 360, {4.0: 20, 8.0: 340}),
        # both fit: each its need, the rest shared in proportion to the needs
        ({4.0: 300, 8.0: 100}, 600, {4.0: 450, 8.0: 150}),
        # the maximum caps a share
        ({4.0: 300, 8.0: 100}, 5000, {4.0: 600, 8.0: 600}),
        # a need past the maximum never counts as fitting
        ({4.0: 900, 8.0: 100}, 5000, {4.0: 20, 8.0: 600}),
        # none fits: the closest to power gets the rest
        ({4.0: 520, 8.0: 410}, 300, {4.0: 20, 8.0: 280}),
        # unknown and unreachable needs keep the minimum; without any need, the largest eps
        ({4.0: None, 8.0: 100}, 300, {4.0: 20, 8.0: 280}),
        ({1.0: None, 2.0: None}, 300, {1.0: 20, 2.0: 280}),
        # a budget below the minimums: every setting still runs its minimum
        ({4.0: 520, 8.0: 210}, 10, {4.0: 20, 8.0: 20}),
    ],
)
def test_plan_trials(
    needs: dict[float, int | None], budget: int, expected: dict[float, int]
) -> None:
    got = plan_trials(needs, budget, minimum=20, maximum=600)
    assert got == expected
    assert all(n >= 20 for n in got.values())
    if budget >= 20 * len(needs):
        assert sum(got.values()) <= max(budget, 20 * len(needs))


@pytest.mark.parametrize(
    "bad",
    [
        {"needs": {}},
        {"budget": -1},
        {"minimum": 0},
        {"maximum": 5},
        {"needs": {4.0: 0}},
    ],
)
def test_plan_trials_rejects_bad_input(bad: dict[str, Any]) -> None:
    kw: dict[str, Any] = {"needs": {4.0: 100}, "budget": 100, "minimum": 10, "maximum": 50}
    kw |= bad
    with pytest.raises(InvalidAuditInput):
        plan_trials(kw.pop("needs"), kw.pop("budget"), **kw)


async def test_a_bootstrap_plans_a_real_run_that_has_power(tmp_path: Path) -> None:
    """End to end on the oracle server: the bootstrap's ``real_trials_for_power`` at epsilon
    8, run as real white-box trials of the same design, gives both figures their power, and
    half of it leaves the white-box figure without, with a need near the bootstrap's.
    Deterministic: power reads only the counts (worlds and held-out split are seeded by the
    plan) and the design, never the noisy outcomes."""
    from tests.auditor.test_runner import _plan, oracle_server

    plan = _plan(**{"mechanism.epsilons": [4.0, 8.0], "design": "auto", "bootstrap.n_llm": 4})
    async with oracle_server(tmp_path) as client:
        boot = await bootstrap_audit(
            plan, db=tmp_path / "a.db", target=client, out_dir=tmp_path, progress=False
        )
        needs = {s["epsilon_theory"]: s["real_trials_for_power"] for s in boot["settings"]}
        assert needs[4.0] > needs[8.0] > 20, needs  # less leakage needs more trials
        runs = {}
        for label, trials in (("planned", needs[8.0]), ("half", needs[8.0] // 2)):
            runs[label] = await run_audit(
                _plan(
                    design="auto",
                    threat_model="white-box",
                    trials=trials,
                    **{"mechanism.epsilons": [8.0]},
                ),
                run_id=label,
                db=tmp_path / "a.db",
                target=client,
                out_dir=tmp_path,
                progress=False,
            )
    planned = runs["planned"]["settings"][0]
    for threat in ("black_box", "white_box"):
        reach = planned[threat]["verdict"]["max_reachable"]
        assert reach >= 0.5 * planned["epsilon_exact"], (threat, reach, needs)
    half = runs["half"]["settings"][0]
    assert half["white_box"]["verdict"]["max_reachable"] < 0.5 * half["epsilon_exact"]
    lacking = trials_for_power_of(half["white_box"], SettingClaims.from_json(half))
    assert lacking is not None and 0.5 * needs[8.0] < sum(lacking) <= needs[8.0]


def test_trials_from_a_bootstrap_are_the_most_its_epsilons_ask() -> None:
    boot: dict[str, Any] = {
        "run_id": "b",
        "kind": "bootstrap",
        "mechanism": "voting",
        "confidence": 0.95,
        "plan": {"split": 0.5},
        "settings": [
            {"epsilon_theory": 1.0, "real_trials_for_power": None},
            {"epsilon_theory": 4.0, "real_trials_for_power": 700},
            {"epsilon_theory": 8.0, "real_trials_for_power": 300},
        ],
    }
    plan: dict[str, Any] = {
        "mechanism": "voting",
        "epsilons": [4.0, 8.0],
        "confidence": 0.95,
        "split": 0.5,
    }
    assert trials_from_bootstrap(boot, **plan) == 700
    assert trials_from_bootstrap(boot, **(plan | {"epsilons": [8.0]})) == 300
    refused = {
        "not a bootstrap": (boot | {"kind": "run"}, plan),
        "audited 'esa'": (boot | {"mechanism": "esa"}, plan),
        "confidence 0.95, this run asks 0.99": (boot, plan | {"confidence": 0.99}),
        "split 0.5, this run asks 0.3": (boot, plan | {"split": 0.3}),
        "no epsilon 2 (it has 1, 4, 8)": (boot, plan | {"epsilons": [2.0]}),
        "gives epsilon 1 power": (boot, plan | {"epsilons": [1.0, 8.0]}),
    }
    for why, (results, asked) in refused.items():
        with pytest.raises(InvalidAuditInput, match=re.escape(why)):
            trials_from_bootstrap(results, **asked)
