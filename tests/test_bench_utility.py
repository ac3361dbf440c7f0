"""bench/utility.py, tiny: the table's rows, its Clopper-Pearson intervals and its costs.

The oracle engine (a labelled simulator) answers in milliseconds; the real run on the
bundled SmolLM2 is in docs/utility.md. Deterministic: the bench seeds its own generators."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "utility.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_utility", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_utility"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_clopper_pearson_reference_values() -> None:
    cp = _bench().clopper_pearson
    # R: binom.test(7, 20)$conf.int -> 0.1539092 0.5921885
    lo, hi = cp(7, 20)
    assert lo == pytest.approx(0.1539092, abs=1e-6)
    assert hi == pytest.approx(0.5921885, abs=1e-6)
    assert cp(0, 10)[0] == 0.0 and cp(10, 10)[1] == 1.0


def test_utility_bench_tiny_oracle(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "u.json"
    result = bench.main(
        [
            "--dataset", "news-mini", "--engine", "oracle", "--queries", "12",
            "--contexts", "2", "--context", "8", "--partitions", "2", "4",
            "--epsilons", "1", "8", "--progress", "0", "--json", str(out),
            "--markdown", str(tmp_path / "u.md"), "--plot", str(tmp_path / "u.png"),
        ]
    )  # fmt: skip
    rows = result["rows"]
    # zero-shot, few-shot, then (2 epsilons + inf) per T
    assert [r["method"] for r in rows] == ["zero-shot", "few-shot"] + ["voting"] * 6
    for r in rows:
        assert r["queries"] == 12
        assert r["ci_low"] <= r["accuracy"] <= r["ci_high"]
        assert r["accuracy"] == r["correct"] / 12
    voting = [r for r in rows if r["method"] == "voting"]
    for r in voting:
        if math.isinf(r["epsilon"]):
            assert r["sigma"] is None and r["epsilon_evaluation"] is None
        else:
            # the whole evaluation on a private context costs more than one answer
            assert r["epsilon_evaluation"] > r["epsilon"]
            assert 0.0 <= r["expected"] <= 1.0
    written = json.loads(out.read_text())
    assert written["simulator"] is True
    assert "nothing was charged" in written["stand_in"]
    assert any(r["epsilon"] == "inf" for r in written["rows"])
    assert (tmp_path / "u.png").stat().st_size > 10_000
    assert "| voting | 4 | 8 |" in (tmp_path / "u.md").read_text()
