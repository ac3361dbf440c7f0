"""The report's table fits the terminal it is printed on (issue 39, item 11): at 80 columns
no line is longer than 80 and every row's figures are there; from 150 columns on it is the
one wide table. Printed by ``dpicl-audit report`` (what the demo prints too) over the golden
trial log, whose runs hold every kind of row (black- and white-box, bootstrap, ESA, DPS-MOZO,
a violation)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpicl_audit.cli import app

GOLDEN = Path(__file__).parent / "fixtures" / "golden_runs"
# Each test writes a report of the nine golden runs (their plots): 20 to 60 s on 2 cores.
pytestmark = pytest.mark.slow

RUNS = sorted(json.loads((GOLDEN / "manifest.json").read_text(encoding="utf-8"))["runs"])


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = tmp_path_factory.mktemp("width") / "log.db"
    with gzip.open(GOLDEN / "trial_log.db.gz", "rb") as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return f"sqlite:///{db}"


def report(log: str, out: Path, columns: int) -> str:
    res = CliRunner().invoke(
        app,
        ["report", *RUNS, "--db", log, "--out", str(out)],
        env={"COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"},
        catch_exceptions=False,
    )
    assert res.exit_code in (0, 4, 5), res.output  # 4/5: the positive control's verdict
    return res.stdout


def test_report_fits_80_columns(log: str, tmp_path: Path) -> None:
    text = report(log, tmp_path, 80)
    data = json.loads((tmp_path / f"report-{RUNS[0]}" / "report.json").read_text())
    rows = data["rows"]
    lines = text.splitlines()
    too_long = [line for line in lines if len(line) > 80 and not line.startswith("report: ")]
    assert not too_long, "\n".join(too_long)
    # One line first: the overall verdict with its exit status in words (issue 45).
    assert lines[0] == data["overall"]["line"]
    assert lines[0].startswith("verdict: VIOLATION · exit 5 (fail) · ")
    # A table, one line per row with its figures: nothing was dropped to fit.
    keys: dict[str, str] = {}
    for r in rows:
        keys.setdefault(r["run_id"], chr(ord("A") + len(keys)))
    table = [line for line in lines if re.match(r"[A-Z]+ +\d", line)]
    assert len(table) == len(rows), table
    for line, r in zip(table, rows, strict=True):
        assert line.split()[:3] == [keys[r["run_id"]], f"{r['epsilon_theory']:g}", r["threat"][:5]]
    for rid, key in keys.items():  # the legend names every run once
        assert sum(line.startswith(f"{key} {rid}: ") for line in lines) == 1, rid
    # Each finding once: every row that is not ok, by its key, setting and threat model.
    for r in rows:
        if r["status"] in ("inconclusive", "nonconforming"):
            where = f"{keys[r['run_id']]} {r['setting'].replace('eps=', 'ε=')} {r['threat']}:"
            assert sum(line.startswith(where) for line in lines) == 1, where
    assert text.count("PRIVACY CLAIM VIOLATED") == sum(r["status"] == "violation" for r in rows)
    # Words are not broken letter by letter: every line holds a word of 3 or more letters
    # or a figure, never a lone fragment.
    assert not [line for line in lines if 0 < len(line.strip()) < 3]
    assert len(lines) < 8 * len(keys) + 2 * len(rows) + 40  # it was 7 lines per row


def test_report_is_one_table_when_wide(log: str, tmp_path: Path) -> None:
    text = report(log, tmp_path, 200)
    assert "ε emp GDP (conf)" in text  # the wide table's header
    assert max(len(line) for line in text.splitlines()) <= 200


def test_inconclusive_cards_say_why_when_the_demo_asks(log: str, tmp_path: Path) -> None:
    """The demo's INCONCLUSIVE cards say in a line why that is expected there (issue 39, item
    14); other cards, and reports that do not ask, carry no such line."""
    from rich.console import Console

    from dpicl_audit.demo.main import WHY_INCONCLUSIVE
    from dpicl_audit.report import write_combined_report

    console = Console(record=True, width=80)
    page = write_combined_report(
        RUNS, log, tmp_path, name="demo", console=console, why_inconclusive=WHY_INCONCLUSIVE
    ).read_text(encoding="utf-8")
    cards = re.findall(r"<div class=card.*?</table></div>", page, re.S)
    inconclusive = [c for c in cards if "badge inconclusive" in c]
    assert inconclusive and len(inconclusive) < len(cards)
    for card in cards:
        assert (WHY_INCONCLUSIVE in card) == (card in inconclusive)
    assert f"INCONCLUSIVE rows: {WHY_INCONCLUSIVE}"[:60] in console.export_text()
    plain = write_combined_report(RUNS, log, tmp_path, name="plain", console=Console(width=80))
    assert WHY_INCONCLUSIVE not in plain.read_text(encoding="utf-8")
