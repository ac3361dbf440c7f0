"""Positive control: a private-voting server with noise 4x too small, served over HTTP with
the unchanged API (``tests/e2e/broken_voting_server.py``), audited as a new user would, with
the ``dpicl-audit`` command line. Every audit of it must be reported as a violation.

Each audit is run with settings under which its attack has power (DESIGN.md section 8, g):

* real trials, white-box (noisy votes from ``/v1/debug/classify``) at epsilon 4 and 8, 240
  trials each: the vote-gap score separates the worlds with mu = 4 x the claimed mechanism's
  (simulated: epsilon_emp >= 5.6 and 13 in 1,000 repetitions, claims 4 and 8);
* real trials, black-box (``/v1/classify`` labels only) at epsilon 2 and 4, T = 2 partitions,
  300 trials each: with too little noise C1's tied vote wins half the time and C0's almost
  never (simulated failure rate 5e-5 at epsilon 2, 0 in 20,000 at 4).
  (With T = 4 the canary's one vote is outvoted 1:3 and a black-box attack sees almost
  nothing at epsilon >= 4, honest server or not.)
* real trials, black-box, the pivotal canary design at epsilon 4 and 8, T = 5, 400 trials:
  with a quarter of the noise, the released label follows the canary's partition almost
  always (expected mu_lower about 4, against a claimed mu of 0.9 and 1.7);
* bootstrap (Algorithm 1) at epsilon 1, 2, 4 and 8, n_llm = 48, 400,000 samples. The
  simulation alone would add the *claimed* noise and see nothing; the noise check
  (``dpicl_audit.estimators.noise_check``) measures the real noise from the debug residuals,
  flags it,
  and the simulation uses its upper confidence bound instead (48 residuals per epsilon: the
  bound stays low enough for a violation at epsilon 1 except with probability ~2e-7).

The run-by-run values are printed, so a failure shows them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ADMIN, USER

pytestmark = pytest.mark.slow

AUDIT = str(Path(sys.executable).with_name("dpicl-audit"))


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [AUDIT, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    # Every audit here finds a VIOLATION: exit status 5 (verdicts.EXIT_CODES).
    assert proc.returncode == 5, f"dpicl-audit {args[0]} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _summary(results: dict[str, Any]) -> str:
    lines = []
    for s in results["settings"]:
        for key in ("black_box", "white_box"):
            est = s.get(key)
            if est and "epsilon_lower" in est:
                lines.append(
                    f"{s['setting']} {key}: emp={est['epsilon_lower']} theory="
                    f"{s['epsilon_theory']} status={est['verdict']['status']}"
                )
    return "\n".join(lines)


@pytest.mark.long
def test_broken_server_is_reported_as_violation(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "oracle",
            "DPICL_WHITEBOX": "internal",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/broken-server.db",
        },
        fault="tests.e2e.broken_voting_server",
    )
    env = os.environ | {
        "DPICL_AUDIT_ADMIN_TOKEN": ADMIN,
        "DPICL_AUDIT_API_KEY": USER,
        "DPICL_AUDIT_DB": f"sqlite:///{tmp_path}/audit.db",
        "COLUMNS": "200",
    }
    common = ["--url", srv.url, "--out", str(tmp_path / "runs"), "--no-progress", "--json"]
    audits = {
        "white-box": [
            "run", "--threat-model", "white-box", "--epsilons", "4,8", "--trials", "240",
        ],
        "black-box": [
            "run", "--threat-model", "black-box", "--epsilons", "2,4", "--partitions", "2",
            "--trials", "300",
        ],
        # Black-box alone at large epsilon: the pivotal canary (T = 5: C1 [3, 2] against
        # C0 [2, 3]) makes the released label as informative as the votes.
        "black-box-pivotal": [
            "run", "--threat-model", "black-box", "--epsilons", "4,8", "--partitions", "5",
            "--trials", "400", "--design", "pivotal",
        ],
        "bootstrap": [
            "bootstrap", "--epsilons", "1,2,4,8", "--n-llm", "48", "--n-sample", "400000",
        ],
    }  # fmt: skip
    for name, args in audits.items():
        results = json.loads(_cli(*args, *common, env=env).stdout)
        summary = _summary(results)
        print(name, summary, sep="\n")
        key = "black_box" if name.startswith("black-box") else "white_box"
        for s in results["settings"]:
            est = s[key]
            # Every epsilon audited proves more leakage than the claim: a violation.
            assert est["verdict"]["status"] == "violation", f"{name}\n{summary}"
            assert est["epsilon_lower"] > s["epsilon_theory"], f"{name}\n{summary}"
            if name == "bootstrap":
                nc = s["noise_check"]
                assert nc["status"] == "smaller" and nc["flagged"], nc
                assert nc["sigma_upper"] < s["sigma"], nc
                assert s["sigma_simulated"] == nc["sigma_upper"]
        # The report says so in plain words, in the terminal and in the HTML.
        rep = _cli("report", results["run_id"], "--out", str(tmp_path / "reports"), env=env)
        assert "VIOLATED" in rep.stdout, rep.stdout
        html_path = tmp_path / "reports" / results["run_id"] / "report.html"
        text = html_path.read_text()
        assert "PRIVACY CLAIM VIOLATED" in text
        # The run's card, above the fold, says it (report/cards.py).
        assert "<span class='badge violation'>VIOLATED</span>" in text
        report = json.loads((html_path.parent / "report.json").read_text())
        assert report["verdicts"][results["run_id"]] == "violation"
        if name == "bootstrap":
            assert "NOISE SMALLER THAN CLAIMED" in text
