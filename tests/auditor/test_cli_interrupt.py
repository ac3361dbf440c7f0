"""Ctrl-C on a real `dpicl-audit run` (SIGINT to the process, as a terminal sends it): it
stops with one line saying how to resume, exit status 130, no traceback and no "Task
exception was never retrieved"; the resume it names then finishes the run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.auditor.test_resume_kill import _cli, _count, _server_missing
from tests.conftest import ADMIN, USER

pytestmark = pytest.mark.slow


@pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(
    start_server: Callable[..., object], tmp_path: Path
) -> None:
    srv = start_server(
        {"DPICL_ENGINE": "oracle", "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/server.db"}
    )
    url: str = srv.url  # type: ignore[attr-defined]
    db_file = tmp_path / "audit.db"
    db = f"sqlite:///{db_file}"
    env = os.environ | {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    common = ["--db", db, "--out", str(tmp_path / "runs"), "--url", url, "--no-progress"]
    proc = subprocess.Popen(
        [*_cli(), "run", "--run-id", "ctrl-c", "--epsilons", "1,8", "--trials", "1000",
         "--batch-size", "10", "--concurrency", "8", *common],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    # 2,000 trials: enough that a loaded machine cannot finish the run before the signal
    # (800 did once in CI: exit 0 before the test's Ctrl-C).
    deadline = time.monotonic() + 120
    while _count(db_file, "ctrl-c")[1] < 20:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no trials were logged in 120 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "never retrieved" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("interrupted")
    assert f"resume with: dpicl-audit resume ctrl-c --db {db}" in lines[0]
    logged = _count(db_file, "ctrl-c")[1]
    assert 20 <= logged < 2000
    done = subprocess.run(
        [*_cli(), "resume", "ctrl-c", *common, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # Completed: 0, or 3 where an epsilon had no power (the verdict exit codes,
    # docs/auditing.md); the honest simulator is never NONCONFORMING (4) or a VIOLATION (5).
    assert done.returncode in (0, 3), done.stdout + done.stderr
    assert _count(db_file, "ctrl-c")[1] == 2000
