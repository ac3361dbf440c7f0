"""Contextual calibration of voting (issue 45): ``label_calibration: "content-free"`` divides
each partition's label probabilities by those of the content-free input "N/A" under the same
exemplars (Zhao et al. 2021) before the partition votes. Row t of the calibrated scores is a
function of row t of the query's and the content-free input's scores only, so a partition's
vote still depends on its own exemplars alone (the sensitivity argument is unchanged)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from dpicl.engines.base import PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from dpicl.pipelines.votes import ABSTAIN, CONTENT_FREE, content_free_calibrated, partition_votes
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
