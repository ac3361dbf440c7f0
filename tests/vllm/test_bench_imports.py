"""The benchmarks that use vLLM, run as documented (``python bench/X.py``: bench/ first on
sys.path), import vllm. bench/requests.py once shadowed the ``requests`` package there, and
``import vllm`` failed (``module 'requests' has no attribute 'Response'``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.vllm.conftest import needs_vllm

ROOT = Path(__file__).resolve().parents[2]


@needs_vllm
def test_gpu_bench_imports_vllm_as_a_script() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--check-imports", "--engines=vllm"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "vllm: imports ok" in out.stdout


@needs_vllm
def test_gpu_bench_tiny_runs_vllm_on_cpu(tmp_path: Path) -> None:
    """``python bench/gpu.py --tiny`` as its docstring gives it for this environment: the vLLM
    rows of the toy model are measured (the toy once had a head of 16, which vLLM's CPU
    attention refuses, and the run died at its first vLLM query)."""
    out_file = tmp_path / "rows.jsonl"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu.py"),
            "--tiny",
            "--engines=vllm",
            "--concurrency=1,2",
            "--queries=2",
            f"--out={out_file}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [(r["engine"], r["model"], r["concurrency"]) for r in rows] == [
        ("vllm", "tiny-llama", 1),
        ("vllm", "tiny-llama", 2),
    ]
    assert all(len(r["seconds"]) == 2 and min(r["seconds"]) > 0 for r in rows)
    assert "device = cpu" in out.stdout  # no GPU here: the default device is the CPU
