"""bench/utility_calibration.py: its calibration and, on the oracle simulator, its rows.

The real figures on the bundled SmolLM2 are in docs/utility.md. Deterministic: the draws and
the sampled releases come from the bench's seed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dpicl.pipelines.votes import content_free_calibrated

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
