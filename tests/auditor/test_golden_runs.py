"""Runs written by the auditor as of issue 28's start still read, recompute and report as they
did: the same JSON, the same verdicts, the same exit codes (issue 28, item 2: "stored results
still load"; "the JSON that users read stays the same").

The fixture (``fixtures/golden_runs/``, made by ``fixtures/make_golden_runs.py``, which says
how) is a trial log of completed runs (voting black-box and white-box, ESA, DPS-MOZO, a
bootstrap, ``--profile verify`` and its tail-gap run, a positive control found in VIOLATION)
and, for each run, the JSON the command line printed or wrote then. This test uses the public
command line only (``dpicl_audit.cli:app``), never a module inside the package, so it holds
while the package is rearranged.

Compared: every key and value, floats to 1e-9 relative; nothing is ignored but the fields in
:data:`IGNORED`, which depend on when or where the command runs.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpicl_audit.cli import app

GOLDEN = Path(__file__).parent / "fixtures" / "golden_runs"
MANIFEST: dict[str, Any] = json.loads((GOLDEN / "manifest.json").read_text(encoding="utf-8"))
RUNS = sorted(MANIFEST["runs"])
REL = 1e-9
ABS = 1e-12

#: The only fields not compared, each with why (a path into the JSON, ``*`` any key).
IGNORED: dict[tuple[str, ...], str] = {
    ("report_cli", "html"): "the report's path: under the --out directory of this test",
    ("report_cli", "json"): "report.json's path: under the --out directory of this test",
    ("report", "generated_at"): "the time the report was written",
}


#: Keys added since the fixture was made, each with why: present in what the command writes
#: now, absent from the golden JSON (their own tests check their values).
ADDED: dict[tuple[str, ...], str] = {
    ("report", "overall"): "issue 45: the overall verdict and exit status the report opens with",
    ("list", "*", "api"): "issue 45: native and OpenAI runs are told apart in the list",
}


def _added(path: tuple[str, ...]) -> bool:
    return any(
        len(path) == len(pat) and all(p in ("*", q) for p, q in zip(pat, path, strict=True))
        for pat in ADDED
    )


def _ignored(path: tuple[str, ...]) -> bool:
    return any(
        len(path) == len(pat) and all(p in ("*", q) for p, q in zip(pat, path, strict=True))
        for pat in IGNORED
    )


def _diff(got: Any, want: Any, path: tuple[str, ...], out: list[str]) -> None:
    """Every difference between ``got`` and ``want`` (JSON values), as 'path: got != want'."""
    where = "/".join(path)
    if _ignored(path):
        return
    if isinstance(want, dict):
        if not isinstance(got, dict):
            out.append(f"{where}: {type(got).__name__} != object")
            return
        added = {k for k in set(got) - set(want) if _added((*path, k))}
        if set(got) - added != set(want):
            out.append(
                f"{where}: keys added {sorted(set(got) - set(want) - added)}, "
                f"missing {sorted(set(want) - set(got))}"
            )
        for k in want.keys() & got.keys():
            _diff(got[k], want[k], (*path, k), out)
    elif isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            n = len(got) if isinstance(got, list) else type(got).__name__
            out.append(f"{where}: list of {n} != list of {len(want)}")
            return
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _diff(g, w, (*path, str(i)), out)
    elif isinstance(want, float) and not isinstance(want, bool):
        ok = isinstance(got, int | float) and not isinstance(got, bool)
        if not ok or not math.isclose(got, want, rel_tol=REL, abs_tol=ABS):
            out.append(f"{where}: {got!r} != {want!r}")
    elif type(got) is not type(want) or got != want:  # bool, int, str, None: exactly
        out.append(f"{where}: {got!r} != {want!r}")


def assert_same(got: Any, want: Any, name: str) -> None:
    out: list[str] = []
    _diff(got, want, (name,), out)
    assert not out, f"{len(out)} difference(s) from the golden JSON:\n" + "\n".join(out[:40])


def golden(run_id: str, name: str) -> Any:
    return json.loads((GOLDEN / run_id / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The golden log unpacked (``stored``), and a copy whose runs have no stored results
    (``blank``: ``show`` then recomputes them from the logged trials)."""
    tmp = tmp_path_factory.mktemp("golden")
    stored, blank = tmp / "stored.db", tmp / "blank.db"
    with gzip.open(GOLDEN / "trial_log.db.gz", "rb") as src, stored.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copy(stored, blank)
    con = sqlite3.connect(blank)
    with con:
        con.execute("UPDATE runs SET results = NULL")
    con.close()
    return {"stored": f"sqlite:///{stored}", "blank": f"sqlite:///{blank}"}


def cli(*args: str) -> tuple[int, Any]:
    """``dpicl-audit ARGS --json``: exit status and the JSON on stdout."""
    res = CliRunner().invoke(app, [*args, "--json"], catch_exceptions=False)
    assert res.stdout.strip(), f"dpicl-audit {' '.join(args)}: no output\n{res.stderr}"
    return res.exit_code, json.loads(res.stdout)


@pytest.mark.parametrize("run_id", RUNS)
def test_stored_results_load_as_written(logs: dict[str, str], run_id: str) -> None:
    """``show`` reads the stored results and prints what it printed then, which is what the
    audit itself printed (``run --json``; a companion run printed nothing of its own)."""
    code, shown = cli("show", run_id, "--db", logs["stored"])
    assert code == 0
    assert_same(shown, golden(run_id, "show"), "show")
    if (GOLDEN / run_id / "run.json").is_file():
        assert_same(shown, golden(run_id, "run"), "run")


@pytest.mark.parametrize("run_id", RUNS)
def test_results_recompute_from_the_log_as_they_did(logs: dict[str, str], run_id: str) -> None:
    """With no stored results, ``show`` recomputes them from the trials: the estimators and
    verdict rules give today's figures."""
    code, shown = cli("show", run_id, "--db", logs["blank"])
    assert code == 0
    assert_same(shown, golden(run_id, "recomputed"), "recomputed")


@pytest.mark.parametrize("run_id", RUNS)
def test_report_as_it_was(logs: dict[str, str], run_id: str, tmp_path: Path) -> None:
    """``report --json``: the same verdicts and exit code, the same report.json, and the
    run's results.json refreshed to the stored results."""
    code, printed = cli(
        "report", run_id, "--db", logs["stored"], "--out", str(tmp_path), "--strict"
    )
    want = MANIFEST["runs"][run_id]
    # The manifest's codes are --strict's (INCONCLUSIVE exits 3); the default gate passes
    # figures without power (0) and exits as strictly on every finding (4, 5).
    assert (code, printed["verdicts"][run_id]) == (want["report_exit_code"], want["verdict"])
    if "exit_code" in want:  # the audit's own exit status then (a companion run has none)
        assert code == want["exit_code"]
    lenient, _ = cli("report", run_id, "--db", logs["stored"], "--out", str(tmp_path / "g"))
    assert lenient == (0 if code == 3 else code)
    assert_same(printed, golden(run_id, "report_cli"), "report_cli")
    out = tmp_path / run_id
    assert Path(printed["html"]) == out / "report.html" and (out / "report.html").is_file()
    assert Path(printed["json"]) == out / "report.json"
    assert_same(json.loads((out / "report.json").read_text()), golden(run_id, "report"), "report")
    results = json.loads((out / "results.json").read_text())
    assert_same(results, golden(run_id, "show"), "results")


def test_combined_report_and_list_as_they_were(logs: dict[str, str], tmp_path: Path) -> None:
    """One report of every run (the worst verdict's exit code) and ``list``."""
    combined = MANIFEST["combined_report"]
    code, printed = cli(
        "report", *combined["run_ids"], "--db", logs["stored"], "--out", str(tmp_path), "--strict"
    )
    assert code == combined["exit_code"]
    assert_same(printed["verdicts"], combined["verdicts"], "verdicts")
    code, listed = cli("list", "--db", logs["stored"])
    assert code == 0
    assert_same(listed, json.loads((GOLDEN / "list.json").read_text()), "list")


def test_the_fixture_covers_every_verdict_and_kind() -> None:
    """The golden runs keep what they are for: an INCONCLUSIVE, a consistent run and a
    VIOLATION; each mechanism; a bootstrap, a white-box run and a verify companion."""
    runs = MANIFEST["runs"]
    assert {r["verdict"] for r in runs.values()} >= {"inconclusive", "ok", "violation"}
    assert {r["report_exit_code"] for r in runs.values()} >= {0, 3, 5}
    shown = {rid: golden(rid, "show") for rid in RUNS}
    assert {s["mechanism"] for s in shown.values()} == {"voting", "esa", "dps-mozo"}
    assert any(s["kind"] == "bootstrap" for s in shown.values())
    assert any("white-box" in s["threat_models"] for s in shown.values() if s["kind"] == "run")
    assert any(r.get("companion_of") for r in runs.values())
