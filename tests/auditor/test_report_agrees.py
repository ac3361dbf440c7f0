"""The report's parts agree with its verdicts (issue 45): the ledger's claim check reads
"at least", no TPR at a low FPR from fewer trials than it needs, the server row holds no
empty cell or second "status", a run the demo stopped at its time limit is not called
interrupted, plot ticks read as sizes, and the tables below the cards stack on a phone."""

from __future__ import annotations

import re

from dpicl_audit.report.ledger_section import _expected, _tail_cell, stacked
from dpicl_audit.report.plots import _short
from dpicl_audit.report.run_words import STATUS_WORDS
from dpicl_audit.report.run_words import health_line as _health


def test_claim_check_reads_at_least_and_others_equal() -> None:
    claim = {"check": "the reported noise admits the answers the claim implies", "ok": True}
    assert _expected(claim | {"reported": 3, "expected": 2}) == "at least 2"
    assert _expected({"check": "refuses exactly when the budget is spent", "expected": 2}) == "= 2"
    assert _expected({"check": "a refused query is not charged", "expected": None}) == "-"


def test_no_tail_figure_from_too_few_trials() -> None:
    at = {"0.1": 0.5, "0.01": 0.25, "0.001": 0.125}
    assert _tail_cell(at, 0.1, 14) == "<td>0.500</td>"  # 10 trials without suffice
    assert ">-</td>" in _tail_cell(at, 0.01, 14) and "100" in _tail_cell(at, 0.01, 14)
    assert ">-</td>" in _tail_cell(at, 0.001, 999)
    assert _tail_cell(at, 0.001, 1000) == "<td>0.125</td>"
    assert _tail_cell(at, 0.001, None) == "<td>0.125</td>"  # counts not stored: as before


def test_server_row_is_one_line_without_a_second_status() -> None:
    text = _health({"status": "ok", "engine": "transformers", "model": "", "limits": {"a": 1}})
    assert "liveness=ok" in text and "engine=transformers" in text and "limits=a=1" in text
    assert "status" not in text and "model" not in text
    assert "not recorded" in _health({})


def test_time_limited_is_not_interrupted() -> None:
    assert "time limit" in STATUS_WORDS["time-limited"]
    assert "interrupted" not in STATUS_WORDS["time-limited"]


def test_ticks_read_as_sizes() -> None:
    assert [_short(v) for v in (6628, 21972, 500, 2000, 40000, 1_250_000)] == [
        "6.6k",
        "22k",
        "500",
        "2k",
        "40k",
        "1.2M",
    ]


def test_stacked_labels_every_cell() -> None:
    table = stacked(
        "<table><tr><th>run</th><th class=l>probe</th><th>s</th></tr>"
        "<tr><td>demo run</td><td class='ok'>ledger</td><td>1.0</td></tr>"
        "<tr><td>b</td><td>tails</td><td>-</td></tr></table>"
    )
    assert table.startswith("<table class=stack><tr class=head>")
    labels = re.findall(r"data-label='([^']*)'", table)
    assert labels == ["run", "probe", "s"] * 2
    assert table.count("class=first") == 2


def test_stacked_keeps_a_first_cells_own_class() -> None:
    table = stacked(
        "<table><tr><th>a</th><th>b</th></tr><tr><td class='l wrap' style='x'>A</td>"
        "<td>B</td></tr><tr><td class=l>A</td><td>B</td></tr></table>"
    )
    assert "<td data-label='a' class='first l wrap' style='x'>A</td>" in table
    assert "<td data-label='a' class='first l'>A</td>" in table
