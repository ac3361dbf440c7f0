"""DPS-MOZO's proven mode audited as a user would: real server processes (oracle engine, at
``DPICL_WHITEBOX=internal``) and the ``dpicl-audit`` command line.

* The honest ``dpicl serve``: the white-box token check passes and the black-box verdict is
  against a true claim (no "nominal" wording); ``--guarantee paper`` stays nominal.
* The positive control ``tests/e2e/broken_mozo_server.py`` (eps0 twice as loose as it
  reports, its own log-ratios clipped to the claim): VIOLATION, naming the token, in the
  results and in the report. On the oracle's pseudo-random logits the constraint binds on
  practically every token (the in-process test checks radius > 0.99 eps0), so 20 trials
  cannot miss it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.results import results_exit_code
from tests.conftest import ADMIN, USER

pytestmark = pytest.mark.slow

AUDIT = str(Path(sys.executable).with_name("dpicl-audit"))
MOZO = ("run", "--mechanism", "dps-mozo", "--exemplars", "3", "--trials", "20")


def _env(tmp_path: Path) -> dict[str, str]:
    return os.environ | {
        "DPICL_AUDIT_ADMIN_TOKEN": ADMIN,
        "DPICL_AUDIT_API_KEY": USER,
        "DPICL_AUDIT_DB": f"sqlite:///{tmp_path}/audit.db",
        "COLUMNS": "200",
    }


def _audit(url: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    common = ("--url", url, "--out", str(tmp_path / "runs"), "--no-progress", "--json")
    proc = subprocess.run(
        [AUDIT, *MOZO, *args, *common],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.stdout.strip(), f"exit {proc.returncode}, no JSON; stderr:\n{proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    # the exit status is the run's worst verdict (verdicts.EXIT_CODES), 0 when consistent
    assert proc.returncode == results_exit_code([out]), proc.stderr
    return out


def _server(start_server: Any, tmp_path: Path, name: str, fault: str | None) -> Any:
    env = {
        "DPICL_ENGINE": "oracle",
        "DPICL_WHITEBOX": "internal",
        "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/{name}.db",
    }
    return start_server(env, fault=fault)


@pytest.mark.long
def test_honest_and_broken_dps_mozo_servers_over_the_cli(start_server: Any, tmp_path: Path) -> None:
    honest = _server(start_server, tmp_path, "honest", None)
    white = _audit(honest.url, tmp_path, "--threat-model", "white-box", "--epsilons", "2")
    s = white["settings"][0]
    assert s["guarantee"] == "proven" and not s["nominal"]
    assert s["white_box"]["verdict"]["status"] == "ok", s["white_box"]
    assert s["black_box"]["verdict"]["status"] != "violation"
    assert "nominal" not in s["black_box"]["verdict"]["message"]
    paper = _audit(honest.url, tmp_path, "--guarantee", "paper", "--alpha", "4", "--epsilons", "8")
    p = paper["settings"][0]
    assert p["guarantee"] == "paper" and p["nominal"] and p["alpha"] == 4
    assert "nominal" in p["black_box"]["verdict"]["message"]

    broken = _server(start_server, tmp_path, "broken", "tests.e2e.broken_mozo_server")
    res = _audit(broken.url, tmp_path, "--threat-model", "white-box", "--epsilons", "2")
    wb = res["settings"][0]["white_box"]
    assert wb["verdict"]["status"] == "violation", wb
    assert "token" in wb["verdict"]["message"] and wb["max_radius"] > wb["max_log_ratio"]
    rep = subprocess.run(
        [AUDIT, "report", res["run_id"], "--out", str(tmp_path / "reports")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 5 and "VIOLATED" in rep.stdout, rep.stdout + rep.stderr
