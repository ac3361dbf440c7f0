"""Issue 44, items 1 and 2: refusals and response times as observations
(``dpicl_audit.estimators.channels``), their estimates and the exit status they give.

Randomised checks state their false-failure rate: the generators are seeded (each run draws
the same samples), and where a test asserts that an honest sample is not flagged, the
test's own error (at most its alpha, 1e-4 or below) bounds the chance that another seed
would fail it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpicl_audit.errors import TargetBudgetExhausted, TargetRejected
from dpicl_audit.estimators.channels import (
    TIME_RATIO,
    channel_alpha,
    is_refusal,
    refusal_observation,
    refusal_test,
    timing_test,
)
from dpicl_audit.results import RunResult, refused_trials, results_exit_code
from dpicl_audit.store import TrialRecord, TrialStore

ALPHA = channel_alpha(4)


def _row(i: int, world: int, *, label: str = "Yes", latency: float = 0.01, refused=None):
    obs = refusal_observation(refused) if refused is not None else {"label": label}
    return TrialRecord(
        setting="eps=1",
        trial_index=i,
        world=world,
        context_id=f"c{world}",
        query="q",
        observation=obs,
        decision=None if refused is not None else int(label == "Yes"),
        latency_s=latency,
    )


def _rejected(code: str = "low_confidence", status: int = 422) -> TargetRejected:
    return TargetRejected(status, code, "the query is ambiguous", None, path="/v1/classify")


def test_refusal_observation_is_logged_and_round_trips(tmp_path) -> None:
    store = TrialStore(tmp_path / "a.db")
    store.create_run("r1", kind="run", plan={}, versions={})
    rows = [
        _row(0, 1),
        _row(1, 0, refused=_rejected()),
        _row(2, 0, refused=TargetBudgetExhausted(402, "budget_exhausted", "spent")),
    ]
    store.add_trials("r1", rows, wall_time_s=1.0, llm_calls_per_trial=1)
    back = sorted(store.trials("r1", "eps=1"), key=lambda r: r.trial_index)
    assert [is_refusal(r) for r in back] == [False, True, True]
    ref = back[1].observation["refusal"]
    assert (ref["status"], ref["code"], ref["expected"]) == (422, "low_confidence", False)
    assert back[2].observation["refusal"]["expected"] is True
    assert back[1].decision is None
    # a resumed run sees every logged index as done, refused or not
    assert store.trial_indices("r1", "eps=1") == {0, 1, 2}
    store.dispose()


def test_refusal_depending_on_the_world_is_a_violation() -> None:
    rng = np.random.default_rng(1)
    rows = []
    for i in range(400):
        w = int(rng.integers(2))
        refused = w == 0 and rng.random() < 0.5
        rows.append(_row(i, w, refused=_rejected() if refused else None))
    found = refusal_test(rows, ALPHA)
    assert found is not None and found["status"] == "violation", found
    assert found["refused"][0] == 0 and found["refused"][1] > 50
    assert "low_confidence" in found["message"]


def test_refusal_independent_of_the_world_is_named_not_flagged() -> None:
    # Refusals at one rate in both worlds: a p-value below ALPHA (1.25e-5) has probability
    # at most 1.25e-5 for this seeded sample's law.
    rng = np.random.default_rng(2)
    rows = [
        _row(i, int(w), refused=_rejected() if rng.random() < 0.1 else None)
        for i, w in enumerate(rng.integers(2, size=400))
    ]
    found = refusal_test(rows, ALPHA)
    assert found is not None and found["status"] == "refused", found
    assert found["unexpected"] == sum(found["refused"]) > 0
    assert refusal_test([_row(0, 1), _row(1, 0)], ALPHA) is None


def test_refusal_body_depending_on_the_world_is_a_violation() -> None:
    # Both worlds refused as often, but with another message: the body tells them apart.
    rows = [
        _row(
            i,
            i % 2,
            refused=TargetRejected(
                422, "low_confidence", "votes tied" if i % 2 else "votes close", None
            )
            if i % 4 < 2
            else None,
        )
        for i in range(400)
    ]
    found = refusal_test(rows, ALPHA)
    assert found is not None and found["status"] == "violation", found


def _timed(rng: np.random.Generator, n: int, slow: float, labels=("Yes", "No")):
    rows = []
    for i in range(n):
        w = int(rng.integers(2))
        label = labels[int(rng.integers(len(labels)))]
        base = 0.004 * math.exp(rng.normal(0, 0.3)) + rng.exponential(0.002)  # jitter
        rows.append(_row(i, w, label=label, latency=base * (slow if w == 0 else 1.0)))
    return rows


def test_timing_beyond_the_ratio_is_a_violation_naming_the_median_difference() -> None:
    found = timing_test(_timed(np.random.default_rng(3), 400, slow=20.0), ALPHA)
    assert found is not None and found["status"] == "violation", found
    assert found["slower"] == "C0" and found["median_ratio"] < 0.1
    assert "ms" in found["message"] and found["median_difference_s"] < -0.02  # C1 - C0


@pytest.mark.parametrize("slow", [1.0, 1.2, TIME_RATIO])
def test_timing_within_the_ratio_is_not_flagged(slow: float) -> None:
    # An honest engine whose worlds differ by a factor up to TIME_RATIO (a longer prompt):
    # the composite null holds, each seed's false alarm probability is at most ALPHA.
    for seed in range(5):
        found = timing_test(_timed(np.random.default_rng(10 + seed), 1000, slow=slow), ALPHA)
        assert found is not None and found["status"] == "ok", found


def test_timing_given_the_answer_not_marginally() -> None:
    # A "No" takes 10 times a "Yes" in both worlds and C0 says "No" more often: the worlds'
    # times differ marginally, not given the answer (a DP answer may take its own time).
    rng = np.random.default_rng(4)
    rows = []
    for i in range(1000):
        w = int(rng.integers(2))
        label = "No" if rng.random() < (0.8 if w == 0 else 0.2) else "Yes"
        rows.append(_row(i, w, label=label, latency=0.004 * (10 if label == "No" else 1)))
    found = timing_test(rows, ALPHA)
    assert found is not None and found["status"] == "ok", found


def test_exit_status_of_refusals() -> None:
    base = {"run_id": "r", "settings": [{"setting": "eps=1", "refusals": {"status": "refused"}}]}
    assert refused_trials([base]) and results_exit_code([base]) == 1
    flagged = {
        "run_id": "r",
        "settings": [
            {
                "setting": "eps=1",
                "refusals": {"status": "violation", "message": "x"},
                "black_box": {"verdict": {"status": "violation", "message": "x"}},
            }
        ],
    }
    assert not refused_trials([flagged]) and results_exit_code([flagged]) == 5
    probe = {"run_id": "r", "settings": [], "surface": {"status": "refused", "message": "m"}}
    assert results_exit_code([RunResult.from_json(probe)]) == 1
