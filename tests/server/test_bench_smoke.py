"""The serving benchmarks still run (tiny ``--quick`` mode) and print their ratios.

A smoke test, not a benchmark: it asserts that every ratio line is printed with a finite
number, never a speed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import free_port

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(*args: str) -> str:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / args[0]), *args[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stdout


@pytest.mark.slow
def test_throughput_bench_oracle() -> None:
    out = run_bench("throughput.py", "--quick", "--engine", "oracle")
    assert "[oracle      ] voting queries/s" in out
    assert re.search(r"concurrency 4 +\d+\.\d+ q/s -> ratio x\d+\.\d+", out), out


@pytest.mark.slow
def test_throughput_bench_transformers() -> None:
    out = run_bench("throughput.py", "--quick", "--engine", "transformers")
    assert "[transformers] voting queries/s" in out
    assert "the micro-batcher gives x" in out, out
    assert re.search(r"compute ceiling: .* tokens/s ratio x\d+\.\d+", out), out


@pytest.mark.slow
@pytest.mark.long
def test_voting_bench() -> None:
    out = run_bench("voting.py", "--quick")
    for tag in ("[prefix reuse  ]", "[DP layer share]", "[batching      ]", "[warm path     ]"):
        assert tag in out, out
    assert re.search(r"warm vs cold x\d+\.\d+", out), out
    assert re.search(r"work ratio cold/warm x\d+\.\d+; the measured speed-up is \d+%", out), out
    assert re.search(r"share of the query \d+\.\d+%", out), out
    assert re.search(r"stacked in a DynamicCache .* -> x\d+\.\d+; vs one-call", out), out
    assert re.search(r"generations of 16 sampled tokens .* -> x\d+\.\d+; vs one-call", out), out
    assert re.search(r"vs torch.multinomial .* -> x\d+\.\d+", out), out


@pytest.mark.slow
@pytest.mark.long
def test_mozo_bench() -> None:
    out = run_bench("mozo.py", "--quick")
    assert re.search(r"non-private ensemble .* -> ratio \d+\.\d+", out), out
    assert re.search(r"vs recompute .* -> speed-up x\d+\.\d+", out), out
    assert re.search(r"concatenated \(DynamicCache\) .* -> speed-up x\d+\.\d+", out), out


@pytest.mark.slow
@pytest.mark.long
def test_esa_release_check_bench() -> None:
    """The link-by-link check of ESA's black-box release runs end to end on a few trials:
    the auditor's log matches the server's requests, and the closed form is printed."""
    out = run_bench("esa_release_check.py", "--trials", "60", "--port", str(free_port()))
    assert '"log_matches_server": true' in out, out
    assert '"unknown_context_requests": 0' in out, out
    assert re.search(r"C1: n \d+, P\(y1\) \d\.\d+ against 0\.7180", out), out
    assert re.search(r"C0: n \d+, P\(y1\) \d\.\d+ against 0\.2820", out), out
    assert "one embedding per text: True" in out, out


@pytest.mark.slow
@pytest.mark.long
def test_one_epsilon_audit_bench() -> None:
    """This checkout against itself: both medians and both ratios printed."""
    out = run_bench("one_epsilon_audit.py", "--baseline", str(BENCH.parent), "--pairs", "1")
    assert re.search(r"A/B: audit command \d+\.\d+, run wall_time_s \d+\.\d+", out), out
    assert out.count("the run's wall_time_s") == 2, out
