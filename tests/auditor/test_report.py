"""Reports: the table, the plain-words verdicts and the self-contained HTML, from real runs
against the server app (oracle engine, in-process over httpx.ASGITransport)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from dpicl_audit.pipeline.run import bootstrap_audit, run_audit
from dpicl_audit.report import ReportRow, run_verdict, verdict_sentence, write_report
from tests.auditor.test_runner import _plan, _server_missing, oracle_server

pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))


def _row(status: str, emp: float, exact: float = 0.75, theory: float = 1.0) -> ReportRow:
    return ReportRow(
        run_id="r",
        engine="oracle (simulator)",
        method="bootstrap",
        setting="eps=1",
        threat="white-box",
        epsilon_theory=theory,
        epsilon_exact=exact,
        epsilon_emp=emp,
        mu_lower=None,
        confidence=0.95,
        trials=10,
        n_llm=5,
        llm_calls=40,
        wall_time_s=1.0,
        wall_time_shared=True,
        status=status,
        message="",
        noise_check=None,
    )


def test_verdict_words() -> None:
    v = verdict_sentence(_row("violation", 2.5))
    assert v.startswith("PRIVACY CLAIM VIOLATED") and "2.500" in v and "95%" in v
    assert "does not run the mechanism it claims" in v  # also above epsilon_exact
    b = verdict_sentence(_row("bug", 0.9))
    assert b.startswith("BUG") and "the server or the auditor has a bug" in b
    assert "at most 5% of audits of a correct server" in b  # the bound's error rate, said
    run = verdict_sentence(replace(_row("bug", 0.9), family_size=4))  # a run's claims together
    assert "at most 5% of runs of a correct server in which one of its 4 tests" in run
    assert verdict_sentence(_row("ok", 0.7)).startswith("consistent")
    why = "INCONCLUSIVE: this figure alone reads BUG at 95% (...)"
    inc = verdict_sentence(replace(_row("inconclusive", 0.9), message=why))
    assert inc.startswith("INCONCLUSIVE (") and inc.count("INCONCLUSIVE") == 1
    assert inc.endswith("): this figure alone reads BUG at 95% (...)")
    assert run_verdict([_row("ok", 0.1), _row("bug", 0.9), _row("ok", 0.2)]) == "bug"
    assert run_verdict([_row("bug", 0.9), _row("violation", 2.0)]) == "violation"


async def test_single_and_combined_reports(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    async with oracle_server(tmp_path) as client:
        boot = await bootstrap_audit(
            _plan(**{"bootstrap.n_llm": 8, "bootstrap.n_sample": 20_000}),
            db=db,
            target=client,
            out_dir=tmp_path / "runs",
            progress=False,
        )
        real = await run_audit(
            _plan(threat_model="white-box", trials=60),
            db=db,
            target=client,
            out_dir=tmp_path / "runs",
            progress=False,
        )
    url = f"sqlite:///{db}"
    out = tmp_path / "reports"

    console = Console(record=True, width=200)
    path = write_report(real["run_id"], url, out, console=console)
    assert path == out / real["run_id"] / "report.html"
    text = console.export_text()
    assert real["run_id"] in text and "ε emp" in text and "white-box" in text  # the table
    # The runner's results.json keeps its format; report.json holds the table.
    results = json.loads((path.parent / "results.json").read_text())
    assert results["run_id"] == real["run_id"] and "settings" in results
    rep = json.loads((path.parent / "report.json").read_text())
    # 60 real trials could not have seen a violation: the report says so
    assert rep["verdicts"] == {real["run_id"]: "inconclusive"}
    assert any(r["status"] == "inconclusive" for r in rep["rows"])
    assert all(r["epsilon_classic"] is not None for r in rep["rows"])
    assert {(r["setting"], r["threat"]) for r in rep["rows"]} == {
        (s, t) for s in ("eps=2", "eps=8") for t in ("black-box", "white-box")
    }
    for r in rep["rows"]:
        assert r["trials"] == 60 and r["llm_calls"] == 60 * 4 and r["wall_time_s"] > 0
        assert r["epsilon_emp"] <= r["epsilon_exact"] <= r["epsilon_theory"]
    # epsilon_emp against the number of trials, recomputed on prefixes of the log.
    curve = rep["trials_curves"][real["run_id"]]["eps=8"]["white-box"]
    assert [n for n, _ in curve][-1] == 60 and len(curve) >= 3

    both = write_report(
        [boot["run_id"], real["run_id"]], url, out, name="both", notes=["a note"], console=console
    )
    html = both.read_text()
    # Self-contained: four embedded PNG plots (epsilons, trade-off, and epsilon against real
    # and against simulated trials, kept apart), nothing fetched from elsewhere.
    assert len(re.findall(r"src='data:image/png;base64,", html)) == 4
    assert "number of real trials" in html and "number of simulated trials" in html
    # A point of those curves is read many times over the same trials: not a claim.
    assert html.count("not corrected for one another") == 2
    assert "Noise check" in html  # the bootstrap's noise check is shown
    assert not re.search(r"(src|href)=['\"]?https?:", html)
    assert "a note" in html and "consistent with the claim, with the power" in html
    # one JSON per report: report.json (no byte-identical results.json beside it)
    assert not (both.parent / "results.json").exists()
    combined = json.loads((both.parent / "report.json").read_text())
    assert set(combined["runs"]) == {boot["run_id"], real["run_id"]}
    boot_rows = [r for r in combined["rows"] if r["run_id"] == boot["run_id"]]
    assert len(boot_rows) == 4 and all(r["method"] == "bootstrap" for r in boot_rows)
    assert all(r["trials"] == 40_000 and r["n_llm"] == 8 for r in boot_rows)
    # 8 clean rows per world: the check's interval is wider than the sigma it measures
    assert all(r["noise_check"]["status"] in ("consistent", "inconclusive") for r in boot_rows)
    bcurve = combined["trials_curves"][boot["run_id"]]["eps=8"]["white-box"]
    assert bcurve[-1][0] == 40_000 and bcurve[0][0] == 2_000
