"""Calibration of voting (issue 45): ``label_calibration: "content-free"`` divides each
partition's label probabilities by those of the content-free input "N/A" under the same
exemplars (Zhao et al. 2021) before the partition votes; ``"exemplars"`` by the mean label
distribution of the partition's own exemplar inputs under its prompt (batch calibration, Zhou
et al. 2024). Row t of the calibrated scores is a function of partition t's scores only, so a
partition's vote still depends on its own exemplars alone (the sensitivity argument is
unchanged)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from dpicl.engines.base import PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from dpicl.mechanisms.voting.exemplar_calibration import BiasCache, biases_from_scores
from dpicl.mechanisms.voting.mechanism import VOTING, VotingSettings
from dpicl.pipelines.partitions import partition_exemplar_prompts
from dpicl.pipelines.votes import (
    ABSTAIN,
    CONTENT_FREE,
    content_free_calibrated,
    exemplar_bias,
    exemplar_calibrated,
    partition_votes,
)
from dpicl.store.records import StoredContext
from tests.conftest import admin_headers
from tests.server.api_helpers import make_client, voting_context


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def test_calibration_divides_by_the_content_free_probabilities() -> None:
    scores = np.array([[-0.5, -1.5], [-3.0, -0.1]])
    free = np.array([[0.0, -2.0], [-1.0, -1.0]])
    got = content_free_calibrated(scores, free)
    want = _log_softmax(scores) - _log_softmax(free)
    assert np.allclose(got, want)
    # p(label | query) / p(label | N/A): the bias toward label 0 in row 0 is taken out
    assert np.argmax(scores[0]) == 0 and np.argmax(got[0]) == 1
    assert np.argmax(got[1]) == np.argmax(scores[1])  # an unbiased row keeps its vote


def test_each_row_depends_on_its_own_partition_only() -> None:
    rng = np.random.default_rng(3)
    scores, free = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    base = content_free_calibrated(scores, free)
    changed_scores, changed_free = scores.copy(), free.copy()
    changed_scores[2] += rng.normal(size=3)
    changed_free[2] += rng.normal(size=3)
    after = content_free_calibrated(changed_scores, changed_free)
    rows = [t for t in range(5) if not np.allclose(after[t], base[t])]
    assert rows == [2]


def test_unusable_scores_still_abstain() -> None:
    scores = np.array([[np.nan, -1.0], [-0.2, -1.0]])
    free = np.array([[-0.5, -0.5], [-0.5, -0.5]])
    votes = partition_votes(content_free_calibrated(scores, free), 0.0, np.random.default_rng(0))
    assert votes[0] == ABSTAIN and votes[1] == 0


class _Biased(OracleEngine):
    """Scores biased toward "Yes" for every input, more so for the content-free one: the
    raw vote is always "Yes", the calibrated one always "No"."""

    async def score_labels(self, prompts: Sequence[PromptSpec], labels: Sequence[str]) -> list:  # type: ignore[override]
        assert list(labels) == ["Yes", "No"]
        return [[0.0, -2.0] if p.query == CONTENT_FREE else [-0.5, -1.5] for p in prompts]


@pytest.mark.parametrize(("mode", "vote"), [("none", "Yes"), ("content-free", "No")])
def test_the_option_through_the_api(tmp_path: Path, mode: str, vote: str) -> None:
    with make_client(tmp_path, whitebox="internal", engine=_Biased()) as c:
        body = voting_context(mechanism={"epsilon": 8.0, "label_calibration": mode})
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        assert r.json()["mechanism"]["label_calibration"] == mode
        r = c.post(
            "/v1/debug/classify",
            json={"context_id": cid, "query": "Private record number 1"},
            headers=admin_headers(),
        )
        assert r.status_code == 200, r.text
        assert r.json()["partition_votes"] == [vote] * 4


def test_an_unknown_mode_is_refused_naming_it(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        body = voting_context(mechanism={"label_calibration": "contextual"})
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 422 and "label_calibration" in r.text


@pytest.mark.parametrize(("mode", "vote"), [("none", "Yes"), ("content-free", "No")])
def test_the_zero_shot_baseline_is_calibrated_as_its_context(
    tmp_path: Path, mode: str, vote: str
) -> None:
    with make_client(tmp_path, engine=_Biased()) as c:
        body = voting_context(mechanism={"epsilon": 8.0, "label_calibration": mode})
        cid = c.post("/v1/contexts", json=body, headers=admin_headers()).json()["id"]
        r = c.post(
            "/v1/zero-shot", json={"context_id": cid, "query": "anything"}, headers=admin_headers()
        )
        assert r.status_code == 200, r.text
        assert r.json()["label"] == vote


def test_the_exemplar_bias_by_hand() -> None:
    # Two exemplar inputs scored under one partition's prompt, two labels.
    # log-softmax([0, -ln 3]) = [ln 3/4, ln 1/4]; log-softmax([0, 0]) = [ln 1/2, ln 1/2].
    reference = np.array([[0.0, -np.log(3.0)], [0.0, 0.0]])
    bias = exemplar_bias(reference)
    want = np.array([[(np.log(0.75) + np.log(0.5)) / 2, (np.log(0.25) + np.log(0.5)) / 2]])
    assert np.allclose(bias, want)
    # The query's p = (0.6, 0.4): calibrated = ln 0.6 - bias0, ln 0.4 - bias1. The bias
    # favours label 0 (geometric mean sqrt(3/8) against sqrt(1/8)), so the vote flips to 1.
    scores = np.log(np.array([[0.6, 0.4]]))
    got = exemplar_calibrated(scores, bias)
    assert np.allclose(got, [[np.log(0.6) - want[0, 0], np.log(0.4) - want[0, 1]]])
    assert np.argmax(scores[0]) == 0 and np.argmax(got[0]) == 1
    # No exemplar: no bias, the log-softmax of the raw scores.
    assert np.allclose(exemplar_bias(np.zeros((0, 2))), 0.0)


def test_each_partitions_bias_comes_from_its_own_rows_only() -> None:
    rng = np.random.default_rng(4)
    sizes = [3, 2, 3]
    scores = rng.normal(size=(8, 4))
    base = biases_from_scores(sizes, scores)
    assert np.allclose(base[1], exemplar_bias(scores[3:5])[0])
    changed = scores.copy()
    changed[3:5] += rng.normal(size=(2, 4))  # partition 1's exemplar rows only
    after = biases_from_scores(sizes, changed)
    rows = [t for t in range(3) if not np.allclose(after[t], base[t])]
    assert rows == [1]


def _stored(exemplars: list[tuple[str, str]], partitions: int = 4) -> StoredContext:
    cal = VOTING.calibrate(
        VotingSettings(epsilon=8.0, partitions=partitions, partition_seed=7), len(exemplars)
    )
    return StoredContext(
        id="ctx_" + "1" * 24,
        name=None,
        task="classification",
        labels=("Yes", "No"),
        exemplars=tuple(exemplars),
        template="{exemplars}{query}",
        mechanism=VOTING.record(cal),
        budget=None,
        mu2_spent=0.0,
        mu2_max=None,
        queries=0,
        max_queries=None,
        created_at=datetime.now(UTC),
    )


def test_changing_one_exemplar_changes_one_partitions_calibration_prompts() -> None:
    shots = [(f"record {i}", "Yes" if i % 2 else "No") for i in range(12)]
    before = partition_exemplar_prompts(_stored(shots))
    assert sorted(len(p) for p in before) == [3, 3, 3, 3]
    shots[5] = ("a different record", shots[5][1])
    after = partition_exemplar_prompts(_stored(shots))
    differ = [t for t in range(4) if [p.text for p in before[t]] != [p.text for p in after[t]]]
    assert len(differ) == 1
    # Each partition's exemplar inputs are asked under that partition's own exemplars.
    for prompts in after:
        for p in prompts:
            assert p.query in [e.input for e in p.exemplars]


class _ExemplarsLookYes(OracleEngine):
    """Every prompt leans to "Yes"; an exemplar's own input more than a query: the raw vote
    is always "Yes", the exemplar-calibrated one "No". Counts the prompts of each call."""

    calls: list[int]

    async def score_labels(self, prompts: Sequence[PromptSpec], labels: Sequence[str]) -> list:  # type: ignore[override]
        self.calls.append(len(prompts))
        seen = [{e.input for e in p.exemplars} for p in prompts]
        return [
            [0.0, -3.0] if p.query in s else [-0.5, -1.5]
            for p, s in zip(prompts, seen, strict=True)
        ]


@pytest.mark.parametrize(("mode", "vote"), [("none", "Yes"), ("exemplars", "No")])
def test_exemplar_calibration_through_the_api_scores_its_exemplars_once(
    tmp_path: Path, mode: str, vote: str
) -> None:
    engine = _ExemplarsLookYes()
    engine.calls = []
    with make_client(tmp_path, whitebox="internal", engine=engine) as c:
        body = voting_context(mechanism={"epsilon": 8.0, "label_calibration": mode})
        r = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        assert r.json()["mechanism"]["label_calibration"] == mode
        for i in range(3):
            r = c.post(
                "/v1/debug/classify",
                json={"context_id": cid, "query": f"Private record number {20 + i}"},
                headers=admin_headers(),
            )
            assert r.status_code == 200, r.text
            assert r.json()["partition_votes"] == [vote] * 4
        r = c.post(
            "/v1/zero-shot", json={"context_id": cid, "query": "anything"}, headers=admin_headers()
        )
        assert r.json()["label"] == "Yes"  # no exemplars: the zero-shot baseline stays raw
    # 4 partition prompts per answer; the 8 exemplar prompts only in the first (then cached).
    first = 4 + 8 if mode == "exemplars" else 4
    assert engine.calls[:3] == [first, 4, 4]


def test_the_bias_cache_is_bounded_and_checked_against_the_context() -> None:
    cache = BiasCache(max_entries=2)
    engine = OracleEngine()
    a = _stored([(f"r{i}", "Yes") for i in range(4)])
    cache.put(a, engine, np.zeros((4, 2)))
    assert cache.get(a, engine) is not None
    # The same id with other exemplars (a test reusing an id) or another engine: a miss.
    assert cache.get(_stored([(f"s{i}", "Yes") for i in range(4)]), engine) is None
    assert cache.get(a, OracleEngine()) is None
    for k in range(3):
        cache.put(replace(a, id=f"ctx_{k:024d}"), engine, np.ones((4, 2)))
    assert len(cache) == 2 and cache.get(a, engine) is None
