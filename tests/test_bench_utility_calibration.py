"""bench/utility_calibration.py: its calibration and, on the oracle simulator, its rows; the
server's exemplar calibration against the bench's, on the bundled model.

The real figures on the bundled SmolLM2 are in docs/utility.md. Deterministic: the draws and
the sampled releases come from the bench's seed."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpicl.domain import DEFAULT_TEMPLATES
from dpicl.mechanisms.voting.mechanism import VOTING, VotingSettings
from dpicl.mechanisms.voting.pipeline import paid_scores
from dpicl.pipelines.partitions import partition_exemplar_prompts
from dpicl.pipelines.votes import content_free_calibrated, exemplar_bias, exemplar_calibrated
from dpicl.store.records import StoredContext
from dpicl_audit.datasets import load_dataset

BENCH = Path(__file__).resolve().parents[1] / "bench" / "utility_calibration.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_utility_calibration", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_utility_calibration"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_one_reference_row_is_the_servers_content_free_calibration() -> None:
    rng = np.random.default_rng(5)
    scores, free = rng.normal(size=(6, 3)) * 4, rng.normal(size=(1, 3)) * 4
    mine = _bench().calibrated(scores, free)
    assert np.allclose(mine, content_free_calibrated(scores, np.repeat(free, 6, axis=0)))


def test_a_label_prior_shared_by_queries_and_reference_cancels() -> None:
    # The point of calibrating: a bias the prompt puts on a label, added to every row's
    # score alike, no longer decides the vote.
    rng = np.random.default_rng(6)
    scores, reference = rng.normal(size=(8, 2)), rng.normal(size=(4, 2))
    prior = np.array([[5.0, 0.0]])  # swamps the input: raw argmax is always label 0
    assert (np.argmax(scores + prior, axis=1) == 0).all()
    calibrate = _bench().calibrated
    biased, clean = calibrate(scores + prior, reference + prior), calibrate(scores, reference)
    # Equal up to a constant per row (the normalisation), so the label margins and votes agree.
    assert np.allclose(biased[:, 0] - biased[:, 1], clean[:, 0] - clean[:, 1])
    assert (np.argmax(biased, axis=1) == np.argmax(clean, axis=1)).all()


def test_rows_on_the_oracle(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--datasets", "news-mini", "--engine", "oracle", "--queries", "8"]
    args += ["--exemplars", "4", "--partitions", "2", "--contexts", "2"]
    _bench().main(args)
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["queries"] == 8 and row["per_partition"] == 2
    assert row["sigma"] == pytest.approx(2 * np.sqrt(np.log(1.25e5)) / 8)
    for cal in ("none", "content-free", "exemplars"):
        cell = row[f"private eps=8 {cal}"]
        assert 0.0 <= cell["expected"] <= 1.0
        assert cell["low"] <= cell["value"] <= cell["high"] and cell["n"] == 8
        assert sum(cell["answers"].values()) == 8
        assert row[f"one partition (2) {cal}"]["n"] == 8
    assert "few-shot exemplars" in row and "zero-shot exemplars" not in row
    assert row["majority"]["label"] in row["labels"]


def test_the_servers_exemplar_calibration_is_the_benchs_on_partition_rows() -> None:
    # The server's exemplar-batch bias is the bench's calibration with the partition's own
    # exemplar rows as the reference (the bench measured; the server serves).
    rng = np.random.default_rng(7)
    scores, reference = rng.normal(size=(1, 3)) * 4, rng.normal(size=(5, 3)) * 4
    server = exemplar_calibrated(scores, exemplar_bias(reference))
    assert np.allclose(server, _bench().calibrated(scores, reference))


class _Free:
    """A ledger that charges nothing (the engine is what this test checks)."""

    async def charge(self, context: StoredContext, cost: object) -> SimpleNamespace:
        return SimpleNamespace(context=context)

    async def settle(self, receipt: object) -> None:
        return None

    async def refund(self, receipt: object) -> None:
        return None


@pytest.mark.slow
@pytest.mark.long  # 157 s on 2 loaded cores (the bundled model, 2 x 8 exemplar prompts)
def test_the_server_path_scores_as_the_bench_on_the_bundled_model() -> None:
    """The voting pipeline with ``label_calibration="exemplars"`` on the real bundled model
    gives, partition by partition, the bench's exemplar-calibrated scores for the same
    exemplars (the bench's prompts, its engine calls): what docs/utility.md measured in the
    bench is what the server answers with. It also moves the scores (not the raw ones)."""
    from tests.server.real_model import load_bundled

    data = load_dataset("reviews-mini")
    shots = tuple((e.input, e.output) for e in data.examples[:8])
    query = data.examples[40].input
    cal = VOTING.calibrate(VotingSettings(epsilon=8.0, partitions=2, partition_seed=3), 8)
    ctx = StoredContext(
        id="ctx_" + "b" * 24,
        name=None,
        task="classification",
        labels=data.labels,
        exemplars=shots,
        template=DEFAULT_TEMPLATES["classification"],
        mechanism=VOTING.record(cal),
        budget=None,
        mu2_spent=0.0,
        mu2_max=None,
        queries=0,
        max_queries=None,
        created_at=datetime.now(UTC),
    )
    engine = load_bundled()

    async def run() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        ledger: Any = _Free()
        cost = VOTING.cost(cal)
        _, first = await paid_scores(
            ctx, query, cost, engine=engine, ledger=ledger, label_calibration="exemplars"
        )
        _, cached = await paid_scores(
            ctx, query, cost, engine=engine, ledger=ledger, label_calibration="exemplars"
        )
        scorer = _bench()._Scorer(engine, list(data.labels))
        bench = []
        for prompts in partition_exemplar_prompts(ctx):
            shots_t = list(prompts[0].exemplars)
            bench.append(await scorer.votes(shots_t, [query]))
        return first, cached, bench

    try:
        first, cached, bench = asyncio.run(run())
    finally:
        asyncio.run(engine.aclose())
    want = np.concatenate([b["exemplars"] for b in bench], axis=0)
    raw = np.concatenate([b["none"] for b in bench], axis=0)
    assert np.allclose(first, want, atol=1e-4), (first, want)
    assert np.allclose(cached, first, atol=1e-4)
    # The calibration is not a constant shift of the raw scores: the label margins move.
    margin = lambda s: s[:, 0] - s[:, 1]  # noqa: E731
    assert np.all(np.abs(margin(want) - margin(raw)) > 1e-3)
