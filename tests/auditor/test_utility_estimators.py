"""The utility audit's pure parts: intervals, ROUGE-L, the plan's draws and the summary."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import beta

from dpicl_audit.errors import InvalidPlan
from dpicl_audit.store import TrialRecord
from dpicl_audit.utility.contexts import calibration_note
from dpicl_audit.utility.estimators import (
    accuracy_interval,
    bootstrap_interval,
    interval_width,
    queries_for_width,
    rouge_l,
)
from dpicl_audit.utility.plan import DEFAULT_QUERIES, DEFAULT_WIDTH, UtilityPlan, draw_split
from dpicl_audit.utility.report import summarise_trials


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (37, 100), (250, 400)])
def test_accuracy_interval_is_clopper_pearson_from_beta_quantiles(k: int, n: int) -> None:
    # The closed form of the exact interval (Clopper and Pearson 1934): beta quantiles.
    low = 0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1)
    high = 1.0 if k == n else beta.ppf(0.975, k + 1, n - k)
    got = accuracy_interval(k, n)
    assert got.value == pytest.approx(k / n)
    assert got.low == pytest.approx(low, abs=1e-9) and got.high == pytest.approx(high, abs=1e-9)


def test_accuracy_interval_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="correct=5, n=4"):
        accuracy_interval(5, 4)


def test_default_queries_give_the_stated_width() -> None:
    assert DEFAULT_QUERIES == 100
    assert round(DEFAULT_WIDTH, 3) == 0.203
    assert (
        interval_width(queries_for_width(0.2)) <= 0.2 < interval_width(queries_for_width(0.2) - 1)
    )
    assert queries_for_width(0.1) > 4 * 90  # a quarter of the width takes ~4x the queries


@pytest.mark.parametrize(
    ("cand", "ref", "want"),
    [
        # Lin (2004), Section 3.1's example: LCS 3 of 4 words both ways -> F = 0.75.
        ("police killed the gunman", "police kill the gunman", 0.75),
        ("the gunman kill police", "police kill the gunman", 0.5),  # LCS "the gunman"
        ("Same words.", "same WORDS", 1.0),
        ("", "anything", 0.0),
    ],
)
def test_rouge_l(cand: str, ref: str, want: float) -> None:
    assert rouge_l(cand, ref) == pytest.approx(want)


def test_bootstrap_interval_covers_the_mean_at_its_level() -> None:
    # 400 samples of 60 Bernoulli(0.3) scores: the 95% interval covers 0.3 in about 94% of
    # them (the percentile bootstrap undercovers slightly at n = 60). The count of misses is
    # Binomial(400, ~0.06); more than 48 has probability below 1e-6 (false failure rate).
    rng = np.random.default_rng(7)
    misses = 0
    for _ in range(400):
        x = (rng.random(60) < 0.3).astype(float)
        ci = bootstrap_interval(x, rng, resamples=500)
        misses += not ci.low <= 0.3 <= ci.high
    assert misses <= 48


def test_bootstrap_interval_is_reproducible_from_the_generator() -> None:
    x = np.arange(20) / 20.0
    a = bootstrap_interval(x, np.random.default_rng(1))
    b = bootstrap_interval(x, np.random.default_rng(1))
    assert a == b and a.low < a.value < a.high


def test_draws_are_disjoint_from_the_queries_and_reproducible() -> None:
    plan = UtilityPlan(dataset="news-mini", queries=100, exemplars=16, contexts=4)
    d = draw_split(200, plan)
    q = set(d.queries.tolist())
    assert len(q) == 100
    seen: set[int] = set()
    for c in d.contexts:
        assert len(set(c.tolist())) == 16 and not q & set(c.tolist())
        assert not seen & set(c.tolist())  # 64 exemplars fit in the 100 left: disjoint draws
        seen |= set(c.tolist())
    again = draw_split(200, plan)
    assert all((a == b).all() for a, b in zip(d.contexts, again.contexts, strict=True))
    assert [d.context_of(i) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(InvalidPlan, match="has 50 examples"):
        draw_split(50, plan)


def test_plan_infers_the_task_and_checks_the_grid() -> None:
    assert UtilityPlan(dataset="dialogsum-mini").mechanism == "esa"
    assert UtilityPlan().task == "classification" and UtilityPlan().dataset == "reviews-mini"
    assert UtilityPlan().label_calibration == "exemplars"
    with pytest.raises(ValueError, match="larger than the exemplars"):
        UtilityPlan(partitions=[32], exemplars=16)
    with pytest.raises(ValueError, match="finite number above 0"):
        UtilityPlan(epsilons=[0.0])


def _rec(setting: str, i: int, ok: int, spent: float, draw: int) -> TrialRecord:
    return TrialRecord(
        setting=setting,
        trial_index=i,
        world=draw,
        context_id=f"{setting}-{draw}",
        query="q",
        observation={"budget": {"spent_epsilon": spent}},
        decision=ok,
        latency_s=0.0,
    )


def test_summary_counts_correct_answers_and_the_ledger_spend() -> None:
    plan = UtilityPlan(dataset="news-mini", epsilons=[1.0], partitions=[4], queries=4, contexts=2)
    recs = [_rec("eps=1,T=4", i, int(i < 3), 0.5 * (i // 2 + 1), i % 2) for i in range(4)]
    recs += [_rec("few-shot", i, 1, 0.1, i % 2) for i in range(4)]
    out = summarise_trials(recs, plan, refused={"zero-shot": "no"})
    cells = {c["setting"]: c for c in out["cells"]}
    assert cells["eps=1,T=4"]["accuracy"]["value"] == 0.75
    assert cells["eps=1,T=4"]["spent_epsilon"] == 1.0 and cells["eps=1,T=4"]["contexts"] == 2
    assert cells["few-shot"]["accuracy"]["value"] == 1.0
    assert cells["zero-shot"]["queries"] == 0 and cells["zero-shot"]["refused"] == "no"
    # Per draw: the private cell's spend only (baselines hold public stand-ins): 1.0.
    assert out["spent_epsilon_per_exemplar"] == 1.0


@pytest.mark.parametrize(
    ("mode", "zero", "few"),
    [
        ("none", "", ""),
        ("content-free", "content-free input", "content-free input"),
        ("exemplars", "uncalibrated (no exemplars", "draw's own exemplars"),
    ],
)
def test_each_baseline_says_how_it_was_calibrated(mode: str, zero: str, few: str) -> None:
    plan = UtilityPlan(label_calibration=mode)  # type: ignore[arg-type]
    cells = {c.kind: c for c in plan.cells()}
    for kind, want in (("zero-shot", zero), ("few-shot", few)):
        note = calibration_note(plan, cells[kind])
        assert (want in note) if want else note == ""
    # A generation task has no label scores to calibrate.
    assert calibration_note(UtilityPlan(dataset="dialogsum-mini"), cells["few-shot"]) == ""


def test_an_unknown_calibration_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="label_calibration"):
        UtilityPlan(label_calibration="batch")  # type: ignore[arg-type]
