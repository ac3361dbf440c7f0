"""The soak's tracer (bench/memtrace.py) finds a leak planted between two snapshots and names
the line that allocated it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.memtrace import DIR_VAR, compare

ROOT = Path(__file__).resolve().parents[1]

LEAKY = """
import os, signal
from bench import memtrace
memtrace.install()
os.kill(os.getpid(), signal.SIGUSR1)  # tracing starts
kept = []
os.kill(os.getpid(), signal.SIGUSR1)
for i in range(20_000):
    kept.append(["record", f"leaked record {i:08d} " * 4])  # THE LEAK
os.kill(os.getpid(), signal.SIGUSR1)
"""


def test_compare_names_the_leaking_line_and_the_type_that_grew(tmp_path: Path) -> None:
    env = os.environ | {DIR_VAR: str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", LEAKY], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    snaps = sorted(tmp_path.glob("*.snap"), key=lambda p: int(p.stem.split("-")[1]))
    assert len(snaps) == 3
    quiet = compare(snaps[0], snaps[1])
    leak = compare(snaps[1], snaps[2])
    line = LEAKY.splitlines().index(
        '    kept.append(["record", f"leaked record {i:08d} " * 4])  # THE LEAK'
    )
    top = leak[2]  # after the totals and the C heap's line
    assert top.lstrip().startswith("+"), leak
    assert f"<string>:{line + 1}" in top.split("<-")[0], leak
    kib = float(top.split()[0])
    # 20,000 lists (~70 bytes) each with a string of 108 characters (~160 bytes)
    assert 20_000 * 150 / 1024 < kib < 20_000 * 600 / 1024, top
    assert "list +2" in leak[-1], leak[-1]  # ~20,000 more lists (strings are not tracked)
    assert all(float(q.split()[0]) < 10 for q in quiet[2:-1]), quiet  # KiB: nothing grew
