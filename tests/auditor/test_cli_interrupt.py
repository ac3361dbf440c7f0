"""Ctrl-C on a real `dpicl-audit run` (SIGINT to the process, as a terminal sends it), during
its trials and during its probes from outside: it stops with one line saying how to resume,
exit status 130, no traceback and no "Task exception was never retrieved", keeping the
trials done; the resume it names then finishes the run.

The command is started from this process with SIGINT ignored, as a background job of a
script starts one (``tests.signals``): it must get the signal all the same. Before the
children were given its default disposition, this test failed that way in CI, twice: the
run never saw the Ctrl-C, finished and exited 0. Each moment is found from outside, not from
the time elapsed: the trial log's count, and the server's log of requests (the probes' first
OpenAI-route request; those routes are slowed so that the probes last a while).
"""

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
from tests.signals import ctrl_c_reaches, ignoring_ctrl_c

pytestmark = pytest.mark.slow

PROBES_BEGUN = "POST /v1/chat/completions"
"""A request of the parameters probe that the trials never send."""


@pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))
@pytest.mark.parametrize(
    ("moment", "sig"),
    [("trials", signal.SIGINT), ("probes", signal.SIGINT), ("trials", signal.SIGTERM)],
    ids=["ctrl-c-trials", "ctrl-c-probes", "sigterm-trials"],
)
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(
    start_server: Callable[..., object], tmp_path: Path, moment: str, sig: signal.Signals
) -> None:
    """SIGTERM (a CI job's timeout, ``docker stop``) stops a run as Ctrl-C does, exit 143."""
    requests = tmp_path / "requests.log"
    srv = start_server(
        {
            "DPICL_ENGINE": "oracle",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/server.db",
            "DPICL_TEST_REQUEST_LOG": str(requests),
        },
        fault="tests.e2e.request_log_server",
    )
    url: str = srv.url  # type: ignore[attr-defined]
    db_file = tmp_path / "audit.db"
    db = f"sqlite:///{db_file}"
    env = os.environ | {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    common = ["--db", db, "--out", str(tmp_path / "runs"), "--url", url, "--no-progress"]
    # During the trials: interrupted after 20 of 600 (the signal follows the count within
    # about 0.1 s; a fast machine answers about 500 trials a second). During the probes:
    # few trials, to reach them soon. One probe (the parameters probe, the OpenAI routes'
    # first user, about 2 s), so that the run and its resume stay short.
    per_eps = 300 if moment == "trials" else 50
    with ignoring_ctrl_c():
        proc = subprocess.Popen(
            [*_cli(), "run", "--run-id", "ctrl-c", "--epsilons", "1,8", "--trials", str(per_eps),
             "--batch-size", "10", "--concurrency", "8", "--probes", "parameters", *common],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ctrl_c_reaches,
        )  # fmt: skip

    def reached() -> bool:
        if moment == "trials":
            return _count(db_file, "ctrl-c")[1] >= 20
        return requests.exists() and PROBES_BEGUN in requests.read_text()

    deadline = time.monotonic() + 120
    while not reached():
        assert proc.poll() is None, ("finished before its Ctrl-C", *proc.communicate())
        assert time.monotonic() < deadline, f"the {moment} did not begin in 120 s"
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, (out, err)
    assert "Traceback" not in err and "never retrieved" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("interrupted" if sig == signal.SIGINT else "terminated")
    assert f"resume with: dpicl-audit resume ctrl-c --db {db}" in lines[0]
    assert not (tmp_path / "runs" / "ctrl-c" / "results.json").exists()
    logged = _count(db_file, "ctrl-c")[1]
    if moment == "trials":
        assert 20 <= logged < 2 * per_eps
    else:
        assert logged == 2 * per_eps  # every trial kept; only the probes are left to do
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
    assert _count(db_file, "ctrl-c")[1] == 2 * per_eps
    assert (tmp_path / "runs" / "ctrl-c" / "results.json").exists()
