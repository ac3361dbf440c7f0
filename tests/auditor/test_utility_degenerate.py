"""The utility audit tells a degenerate result from a real one (issue 45): the majority-class
rate is a third baseline, and a cell that answers one label to nearly everything, or whose
accuracy a one-sided exact binomial test cannot tell from the majority rate, is a finding;
when the few-shot baseline is one, the run says the model is degenerate on the dataset."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from scipy.stats import binomtest

from dpicl_audit.store import TrialRecord
from dpicl_audit.utility.plan import UtilityPlan
from dpicl_audit.utility.report import ALPHA, print_utility, summarise_trials

N = 40
LABELS = ["Business"] * 13 + ["Sport"] * 10 + ["Tech"] * 9 + ["Politics"] * 8


def _records(setting: str, answers: Sequence[str]) -> list[TrialRecord]:
    return [
        TrialRecord(
            setting=setting,
            trial_index=i,
            world=i % 2,
            context_id=f"{setting}-{i % 2}",
            query=f"q{i}",
            observation={"label": a, "expected": LABELS[i]},
            decision=int(a == LABELS[i]),
            latency_s=0.0,
        )
        for i, a in enumerate(answers)
    ]


def _summary(**answers: Sequence[str]) -> dict[str, Any]:
    plan = UtilityPlan(dataset="bbc-news", epsilons=[8.0], partitions=[4], queries=N)
    names = {"few": "few-shot", "zero": "zero-shot", "private": "eps=8,T=4"}
    recs = [r for key, a in answers.items() for r in _records(names[key], a)]
    return summarise_trials(recs, plan)


def test_a_model_that_answers_business_to_everything_is_degenerate() -> None:
    """The issue's case: "Business" to all 40 queries in both baselines and the cell."""
    constant = ["Business"] * N
    out = _summary(few=constant, zero=constant, private=constant)
    majority = next(c for c in out["cells"] if c["setting"] == "majority")
    assert majority["label"] == "Business"
    assert majority["accuracy"]["value"] == 13 / 40
    kinds = {(f["setting"], f["kind"]) for f in out["findings"]}
    for setting in ("few-shot", "zero-shot", "eps=8,T=4"):
        assert (setting, "one-label") in kinds and (setting, "at-majority") in kinds
    assert out["degenerate"] == (
        "DEGENERATE on bbc-news: few-shot (non-private) is no better than always answering "
        "'Business' (0.325)"
    )


def test_a_model_clearly_above_the_majority_rate_is_not() -> None:
    right = list(LABELS)
    right[:4] = ["Sport", "Tech", "Sport", "Tech"]  # 36 of 40 right, answers spread
    out = _summary(few=right, private=right, zero=["Business"] * N)
    assert out["degenerate"] is None
    few = next(c for c in out["cells"] if c["setting"] == "few-shot")
    assert few["vs_majority"]["above"] and few["vs_majority"]["p_value"] < 1e-6
    # the zero-shot baseline is still flagged on its own
    assert {f["setting"] for f in out["findings"]} == {"zero-shot"}


def test_private_cells_no_better_than_the_majority_read_degenerate_under_privacy() -> None:
    """A model that reads the exemplars (few-shot well above the majority rate) but whose every
    private cell is the majority label in effect: the run says so, naming both figures."""
    right = list(LABELS)
    right[:4] = ["Sport", "Tech", "Sport", "Tech"]  # 36 of 40
    out = _summary(few=right, private=["Business"] * N)
    assert out["degenerate"] == (
        "DEGENERATE on bbc-news under privacy: every private cell is no better than always "
        "answering 'Business' (0.325), though few-shot (non-private) beats it (0.900)"
    )
    # one private cell above the majority rate: no sentence
    assert _summary(few=right, private=right)["degenerate"] is None


def test_the_test_is_the_stated_one_sided_binomial_and_can_go_either_way() -> None:
    # 20/40 correct against a majority rate of 13/40: p = P(X >= 20 | n=40, p=0.325)
    answers = list(LABELS[:20]) + ["Politics" if x != "Politics" else "Tech" for x in LABELS[20:]]
    out = _summary(few=answers)
    few = next(c for c in out["cells"] if c["setting"] == "few-shot")
    want = binomtest(20, 40, 13 / 40, alternative="greater").pvalue
    assert abs(few["vs_majority"]["p_value"] - want) < 1e-12
    assert (want < ALPHA) == few["vs_majority"]["above"]
    # 16/40 is not enough to tell from 0.325 at 5%
    weak = list(LABELS[:16]) + ["Politics" if x != "Politics" else "Tech" for x in LABELS[16:]]
    out = _summary(few=weak)
    assert any(f["kind"] == "at-majority" for f in out["findings"])
    assert out["degenerate"] is not None


def test_printed_with_the_verdict_first_and_the_majority_row() -> None:
    constant = ["Business"] * N
    out = _summary(few=constant, zero=constant, private=constant) | {"run_id": "u1"}
    console = Console(record=True, width=80)
    print_utility(out, console)
    text = console.export_text()
    assert text.splitlines()[0].startswith("DEGENERATE")
    assert "majority" in text and "0.325" in text
    assert all(len(line) <= 80 for line in text.splitlines())
