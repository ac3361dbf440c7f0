"""The black-box DPS-MOZO audit end to end against the real server app (oracle engine),
in-process over httpx.ASGITransport: it runs, logs every trial, estimates and gives a verdict.

On the oracle, DPS-MOZO decodes hash-based pseudo-logits, so the audit measures ~nothing
(the module says so); these tests check the plumbing, not the privacy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpicl_audit.mozo_audit import audit_mozo, decide, main, mozo_design, world_schedule
from dpicl_audit.store import TrialStore
from tests.auditor.test_runner import _server_missing, oracle_server

pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))


def test_design_is_replace_one() -> None:
    d = mozo_design(5, seed=3)
    assert len(d.exemplars_c1) == len(d.exemplars_c0) == 5
    diff = [
        i for i, (a, b) in enumerate(zip(d.exemplars_c1, d.exemplars_c0, strict=True)) if a != b
    ]
    assert diff == [d.position]
    assert d.exemplars_c1[d.position] == {"input": d.query, "output": "red"}
    assert d.exemplars_c0[d.position]["output"] == "blue"
    assert d.exemplars_c0[d.position]["input"] not in d.query  # absent from C0's view
    assert decide("  red car", "red") == 1 and decide("blue", "red") == 0
    assert world_schedule(50, 1) == world_schedule(50, 1)
    assert 0 < sum(world_schedule(50, 1)) < 50


async def test_audit_mozo_end_to_end_oracle(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with oracle_server(tmp_path, whitebox="off") as client:
        res = await audit_mozo(
            client, epsilon=4.0, trials=40, n_exemplars=3, max_tokens=2, db=str(db), seed=7
        )
        left = await client.list_contexts()
    assert left == []  # every audit context deleted
    bb = res["black_box"]
    assert bb["tp"] + bb["fn"] + bb["fp"] + bb["tn"] == 40
    assert res["contexts"]["C1"] == bb["n_pos"] and res["contexts"]["C0"] == bb["n_neg"]
    for key in ("epsilon_emp", "epsilon_theory", "verdict", "alpha", "beta", "per_token_bound"):
        assert key in res
    assert res["epsilon_theory"] == pytest.approx(4.0)
    assert res["verdict"]["status"] in ("ok", "violation")
    assert set(res["verdict"]) >= {"status", "violation", "message"}
    assert bb["epsilon_emp"] >= 0.0 and 0.0 <= bb["fpr_upper"] <= 1.0
    assert res["simulator"] is True and any("ORACLE" in n for n in res["notes"])
    assert res["epsilon_emp"] <= res["epsilon_theory"]  # nothing to find on the oracle
    store = TrialStore(db)
    try:
        rows = store.trials(res["run_id"])
        run = store.get_run(res["run_id"])
    finally:
        store.dispose()
    assert len(rows) == 40 and {r.trial_index for r in rows} == set(range(40))
    assert run.status == "completed" and run.results is not None
    assert run.design is not None and len(run.design["context_ids"]) == 40
    assert all(r.decision in (0, 1) and "text" in r.observation for r in rows)


async def test_audit_mozo_shares_contexts_across_queries(tmp_path: Path) -> None:
    async with oracle_server(tmp_path, whitebox="off") as client:
        res = await audit_mozo(
            client,
            epsilon=8.0,
            trials=20,
            n_exemplars=2,
            max_tokens=1,
            queries_per_context=5,
            seed=1,
        )
    assert res["contexts"]["C1"] == -(-res["black_box"]["n_pos"] // 5)
    assert res["log"] == {"kind": "none"}
    assert res["black_box"]["epsilon_theory_per_answer"] < res["epsilon_theory"]


def test_cli_rejects_missing_token(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--trials", "4"])


def test_dpicl_audit_cli_forwards_to_the_mozo_audit() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "dpicl_audit.cli", "mozo", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--admin-token" in out
    assert "--signals" in out
