"""``python -m dpicl_audit.demo`` end to end with tiny counts on the oracle server only (the
full demo, with the CPU model, is ``make demo``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_quick_oracle(tmp_path: Path) -> None:
    argv = ["-m", "dpicl_audit.demo", "--quick", "--engines", "oracle", "--out", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("report: "))
    report = Path(line.removeprefix("report: "))
    # epsilons, trade-off, epsilon against real trials and against simulated trials
    assert report.is_file() and report.read_text().count("data:image/png;base64,") == 4
    results = json.loads(report.with_name("results.json").read_text())
    kinds = [r["kind"] for r in results["runs"].values()]
    assert kinds.count("bootstrap") >= 1 and kinds.count("run") >= 2  # + real trials
    # 40 real trials per epsilon cannot reach half of epsilon_exact: INCONCLUSIVE, not "ok"
    assert set(results["verdicts"].values()) <= {"ok", "inconclusive"}
    assert "servers stopped" in proc.stderr
