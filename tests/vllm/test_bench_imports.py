"""The benchmarks that use vLLM, run as documented (``python bench/X.py``: bench/ first on
sys.path), import vllm. bench/requests.py once shadowed the ``requests`` package there, and
``import vllm`` failed (``module 'requests' has no attribute 'Response'``)."""

from __future__ import annotations

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
