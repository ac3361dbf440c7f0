"""bench/gpu.py on CPU with a tiny Llama shape: the benchmark runs end to end, counts T = 10
calls per voting query, and reports against paper 000's anchor. (Its GPU figures come from a
CUDA machine; this machine has none.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_bench_tiny_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    assert pytest.approx(8e6 / (700 * 3600), rel=0.02) == bench.ANCHOR
    rows = bench.main(
        [
            "--device=cpu",
            "--engines=transformers",
            "--models=8b",
            "--tiny",
            "--concurrency=1,4",
            "--queries=4",
        ]
    )
    assert [(r.engine, r.model, r.concurrency, r.queries) for r in rows] == [
        ("transformers", "tiny-llama", 1, 4),
        ("transformers", "tiny-llama", 4, 4),
    ]
    assert all(r.seconds > 0 and r.calls_per_s == 4 * 10 / r.seconds for r in rows)
    out = capsys.readouterr().out
    assert "anchor = 3.2 calls/s" in out and "x anchor" in out
    assert "4 in flight / 1 in flight" in out


def test_llama_8b_shape_has_8b_parameters() -> None:
    bench = load_bench()
    s = bench.LLAMA3_8B
    h, f, n, v = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    kv = h // s["num_attention_heads"] * s["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    total = n * per_layer + 2 * v * h + h
    assert total == pytest.approx(8.03e9, rel=0.01)
