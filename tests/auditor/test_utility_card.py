"""The privacy-utility card: `dpicl-audit report AUDIT UTILITY` puts, per setting, the audit's
epsilon emp beside the utility run's accuracy; checked in the HTML and in headless Chromium
at desktop and phone widths."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpicl_audit.cli import app
from dpicl_audit.report.utility_card import utility_card
from dpicl_audit.store import TrialRecord, TrialStore
from dpicl_audit.utility.plan import UtilityPlan
from dpicl_audit.utility.report import summarise_trials
from tests.auditor.test_legacy_log import FIXTURE
from tests.auditor.test_report_browser import _browser, _probe

AUDIT = "legacy-voting-wb"  # a white-box voting audit at epsilon 2 and 8, T = 2


def _utility_log(db: Path) -> tuple[str, dict[str, object]]:
    """A utility run at epsilon 2 and 8 (T = 2) beside the fixture's audits, trials only (the
    report computes its results from them)."""
    plan = UtilityPlan(dataset="news-mini", epsilons=[2.0, 8.0], partitions=[2], queries=20)
    recs = []
    for k, (setting, correct) in enumerate([("eps=2,T=2", 9), ("eps=8,T=2", 14), ("few-shot", 16)]):
        for i in range(20):
            recs.append(
                TrialRecord(
                    setting=setting,
                    trial_index=i,
                    world=i % 4,
                    context_id=f"c{k}-{i % 4}",
                    query=f"q{i}",
                    observation={"budget": {"spent_epsilon": (k + 1) * 1.5}},
                    decision=int(i < correct),
                    latency_s=0.01,
                )
            )
    store = TrialStore(f"sqlite:///{db}")
    try:
        store.create_run("util", plan=plan.stored(), versions={}, kind="utility")
        store.add_trials("util", recs)
    finally:
        store.dispose()
    return "util", summarise_trials(recs, plan, refused={"zero-shot": "refused"})


@pytest.fixture
def card_report(tmp_path: Path) -> Path:
    db = tmp_path / "log.db"
    shutil.copy(FIXTURE, db)
    uid, _ = _utility_log(db)
    args = ["report", AUDIT, uid, "--db", str(db), "--out", str(tmp_path), "--json"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return Path(json.loads(result.stdout)["html"])


def test_the_card_puts_epsilon_emp_beside_accuracy(card_report: Path) -> None:
    page = card_report.read_text(encoding="utf-8")
    assert "<h2>Privacy and utility</h2>" in page
    report = json.loads((card_report.parent / "report.json").read_text())
    emp = [
        (r["setting"], r["epsilon_emp"])
        for r in report["rows"]
        if r["run_id"] == AUDIT and r["epsilon_emp"] is not None
    ]
    card = page[page.index("<h2>Privacy and utility</h2>") :]
    for eps, acc in (("2", "0.450"), ("8", "0.700")):
        row = re.search(rf"<tr><td class='l nw'>ε={eps}, T=2</td>.*?</tr>", card)
        assert row, card[:2000]
        audited = max(v for s, v in emp if s == f"eps={eps}")
        assert f"{audited:.2f}" in row.group(0) and acc in row.group(0)
    assert "few-shot" in card and "0.800 [" in card and "not measured" in card
    assert report["utility"]["util"]["cells"][0]["accuracy"]["n"] == 20


def test_card_html_without_utility_runs_is_empty() -> None:
    assert utility_card([], [], []) == ""


@pytest.mark.slow
@pytest.mark.parametrize("width", [390, 1400])
def test_card_in_headless_chromium(card_report: Path, width: int, tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium on PATH (see tests/auditor/test_report_browser.py)")
    res = _probe(browser, card_report, width, tmp_path)
    assert res["errors"] == [] and res["broken"] == [], res
    assert res["overflow"] == [], res["overflow"]  # the card's table scrolls in its own box
    assert res["scrollWidth"] <= res["width"], res  # type: ignore[operator]


def test_list_labels_a_utility_run_as_one(tmp_path: Path) -> None:
    """`dpicl-audit list` shows a utility run's grid and dataset, and the answers it plans
    (cells x queries, less a refused baseline), not an audit's mechanism fields."""
    db = tmp_path / "log.db"
    shutil.copy(FIXTURE, db)
    uid, results = _utility_log(db)
    store = TrialStore(f"sqlite:///{db}")
    try:
        store.update_run(uid, status="completed", results=results)
    finally:
        store.dispose()
    args = ["list", "--db", str(db), "--json"]
    rows = json.loads(CliRunner().invoke(app, args, catch_exceptions=False).stdout)
    row = next(r for r in rows if r["id"] == uid)
    assert row["kind"] == "utility" and row["mechanism"] == "voting"
    assert row["dataset"] == "news-mini"
    assert row["epsilons"] == [2.0, 8.0] and row["partitions"] == [2]
    assert row["threat_model"] is None and row["attack"] is None
    # 2 private cells + few-shot logged 20 each; zero-shot was refused, so it is not planned
    assert row["trials_logged"] == 60 == row["trials_planned"]
    # the audits beside it keep their rows
    audit = next(r for r in rows if r["id"] == AUDIT)
    assert audit["kind"] != "utility" and audit["threat_model"] == "white-box"
    table = (
        CliRunner()
        .invoke(app, ["list", "--db", str(db)], catch_exceptions=False, env={"COLUMNS": "100"})
        .stdout
    )
    line = next(ln for ln in table.splitlines() if ln.strip().startswith(uid))
    assert "utility · voting on news-mini · ε 2,8 · T 2" in line and "60/60" in line
    assert "inquery" not in line and "black-box" not in line
