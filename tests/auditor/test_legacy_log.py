"""Trial logs written before the pipeline reorganisation (issue 9) still show, report and
resume. The fixture was written by the auditor as of aab986f (tests/auditor/fixtures/README.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpicl_audit.cli import app
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.pipeline.estimation import estimate_run
from dpicl_audit.pipeline.run import resume_audit
from dpicl_audit.plan.schedule import trial_worlds
from dpicl_audit.report import write_report
from dpicl_audit.store import TrialStore
from tests.auditor.test_runner import _server_missing, oracle_server

FIXTURE = Path(__file__).parent / "fixtures" / "legacy_trial_log.db"
RUNS = ("legacy-voting-wb", "legacy-voting-boot", "legacy-partial", "legacy-mozo", "legacy-esa-wb")
ESTIMATE_KEYS = ("epsilon_lower", "mu_lower", "epsilon_lower_classic", "tp", "fp", "threshold")


@pytest.fixture
def legacy_db(tmp_path: Path) -> str:
    path = tmp_path / "legacy.db"
    shutil.copy(FIXTURE, path)
    return f"sqlite:///{path}"


def _estimates(
    results: dict[str, Any], threats: tuple[str, ...] = ("black_box", "white_box")
) -> list[tuple[str, str, str, Any]]:
    out = []
    for s in results["settings"]:
        for threat in threats:
            est = s.get(threat) or {}
            for key in ESTIMATE_KEYS:
                if key in est:
                    out.append((s["setting"], threat, key, est[key]))
    return out


@pytest.mark.parametrize("run_id", ["legacy-voting-wb", "legacy-voting-boot", "legacy-esa-wb"])
def test_old_runs_estimate_as_they_did(legacy_db: str, run_id: str) -> None:
    """The new pipeline recomputes exactly the counts-based estimates the old version stored;
    white-box estimates of real trials are re-selected (issue 14: never weaker than the
    black-box rule) and verdicts re-decided (INCONCLUSIVE without power), so those only have
    to be at least their black-box candidate and carry a verdict of the new vocabulary."""
    store = TrialStore(legacy_db)
    try:
        stored = store.get_run(run_id).results
        fresh = estimate_run(store, run_id).to_json()
    finally:
        store.dispose()
    assert stored is not None
    fresh = json.loads(json.dumps(fresh, default=str))
    boot = run_id == "legacy-voting-boot"
    threats = ("black_box", "white_box") if boot else ("black_box",)
    got, want = _estimates(fresh, threats), _estimates(stored, threats)
    assert got
    assert _close(got, want)
    for s in fresh["settings"]:
        for threat in ("black_box", "white_box"):
            est = s.get(threat)
            if est and "verdict" in est:
                assert est["verdict"]["status"] in ("ok", "inconclusive", "bug", "violation")
        wb = s.get("white_box")
        if wb and not boot and "chosen" in wb:  # the black-box rule is one of its candidates
            assert wb["mu_lower"] >= wb["black_box"]["mu_lower"], s["setting"]


def _close(got: list[Any], want: list[Any]) -> bool:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:3] == w[:3]
        if isinstance(w[3], float):
            assert g[3] == pytest.approx(w[3], rel=1e-9, abs=1e-12), g[:3]
        else:
            assert str(g[3]) == str(w[3]), g[:3]
    return True


def test_cli_lists_and_shows_every_old_run(legacy_db: str) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["list", "--db", legacy_db, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in json.loads(res.stdout)}
    assert set(rows) == set(RUNS)
    assert rows["legacy-mozo"]["mechanism"] == "dps-mozo"
    assert rows["legacy-esa-wb"]["mechanism"] == "esa"
    assert rows["legacy-voting-boot"]["kind"] == "bootstrap"
    assert rows["legacy-partial"]["trials_logged"] == 55
    for run_id in RUNS:
        res = runner.invoke(app, ["show", run_id, "--db", legacy_db], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        assert run_id in res.stdout
    res = runner.invoke(app, ["show", "legacy-mozo", "--db", legacy_db, "--json"])
    shown = json.loads(res.stdout)
    assert shown["mechanism"] == "dps-mozo" and shown["settings"][0]["trials"] == 20


def test_one_report_of_every_old_run(legacy_db: str, tmp_path: Path) -> None:
    path = write_report(list(RUNS), legacy_db, tmp_path, name="legacy")
    rep = json.loads((path.parent / "report.json").read_text())
    assert set(rep["verdicts"]) == set(RUNS)
    mechanisms = {r["run_id"]: r["mechanism"] for r in rep["rows"]}
    assert mechanisms["legacy-mozo"] == "dps-mozo" and mechanisms["legacy-esa-wb"] == "esa"
    html = path.read_text()
    for run_id in RUNS:
        assert run_id in html


@pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))
async def test_an_old_interrupted_run_resumes(legacy_db: str, tmp_path: Path) -> None:
    store = TrialStore(legacy_db)
    try:
        before = {(r.setting, r.trial_index): r for r in store.trials("legacy-partial")}
    finally:
        store.dispose()
    async with oracle_server(tmp_path, whitebox="off") as client:
        # the old run's contexts are gone from this server: identical ones are created
        res = await resume_audit(
            "legacy-partial", db=legacy_db, target=client, progress=False, out_dir=tmp_path
        )
        with pytest.raises(InvalidAuditInput, match="nothing to resume"):
            await resume_audit("legacy-mozo", db=legacy_db, target=client, progress=False)
    assert res["status"] == "completed"
    store = TrialStore(legacy_db)
    try:
        rows = store.trials("legacy-partial", "eps=8")
        plan_seed = int(store.get_run("legacy-partial").plan["seed"])
    finally:
        store.dispose()
    assert [r.trial_index for r in rows] == list(range(40))  # none lost, none twice
    assert [r.world for r in rows] == [int(w) for w in trial_worlds(plan_seed, 1, 40)]
    for r in rows[:15]:  # the old trials are untouched
        assert r.observation == before[("eps=8", r.trial_index)].observation
