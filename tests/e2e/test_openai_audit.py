"""`dpicl-audit run --api openai`: a black-box voting audit whose queries are OpenAI chat
completions against a real `dpicl serve` (oracle engine), with the neighbouring contexts
created as for the native routes, and again by a user-given context hook (a command). The
verdicts equal those of the same plan through the native routes.

Why the verdicts agree by design, not by luck: pivotal design, T = 4 at epsilon 4 (sigma 1.71)
with 600 trials per run. The released label's rates are TPR = 0.795, FPR = 0.5 (docs/
auditing.md); with 300 trials a world the gap of 0.295 is over 7 standard errors, so every
run finds the signal (not INCONCLUSIVE), and a VIOLATION needs the 95%-confidence lower bound
to exceed epsilon_theory = 4 while the mechanism's exact epsilon is 3.51: every run reads
"ok" except with probability well below 1e-4.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpicl_audit.cli import app
from tests.servers import ADMIN, ROOT, USER, oracle_server_env

PLAN = ("--epsilons", "4", "--partitions", "4", "--trials", "600", "--seed", "5")


def _run(url: str, tmp: Path, run_id: str, *extra: str) -> dict[str, Any]:
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    args = ["run", *PLAN, "--url", url, "--db", f"sqlite:///{tmp}/audit.db"]
    args += ["--out", str(tmp / "runs"), "--run-id", run_id, "--no-progress", *extra]
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads((tmp / "runs" / run_id / "results.json").read_text())
    return out


def _verdicts(results: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["setting"], s["black_box"]["verdict"]["status"]) for s in results["settings"]]


@pytest.mark.long
def test_black_box_voting_audit_through_openai_matches_native(
    start_server: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    srv = start_server(oracle_server_env(tmp_path, whitebox="off"))
    native = _run(srv.url, tmp_path, "native")
    via_openai = _run(srv.url, tmp_path, "openai", "--api", "openai")
    monkeypatch.setenv("HOOK_DPICL_URL", srv.url)
    monkeypatch.setenv("HOOK_DPICL_ADMIN", ADMIN)
    hook = f"{sys.executable} {ROOT / 'tests' / 'e2e' / 'openai_hook.py'}"
    hooked = _run(srv.url, tmp_path, "hooked", "--api", "openai", "--context-hook", hook)
    assert _verdicts(native) == [("eps=4", "ok")]
    assert _verdicts(via_openai) == _verdicts(native) == _verdicts(hooked)
    for r in (native, via_openai, hooked):
        s = r["settings"][0]
        assert s["trials"] == 600 and 0 < s["black_box"]["epsilon_lower"] <= s["epsilon_exact"]
    assert via_openai["plan"]["target"]["api"] == "openai"
    assert hooked["plan"]["target"]["context_hook"] == hook
    # The openai runs' contexts were queried through chat completions: each charged its
    # trials on the server's ledger like the native run's.
    ids = {r["settings"][0]["context_ids"]["C1"] for r in (native, via_openai, hooked)}
    assert len(ids) == 3
