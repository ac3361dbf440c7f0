"""The overall verdict line (issue 45): one line that names the worst verdict and the exit
status the gate gives, the same as :func:`results_exit_code`, for the golden runs and for
made-up mixes of statuses; at most 80 characters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpicl_audit.report.run_words import overall_html as _overall_html
from dpicl_audit.results import RunResult, results_exit_code
from dpicl_audit.results.overall import overall_verdict
from dpicl_audit.verdicts import Status

GOLDEN = Path(__file__).parent / "fixtures" / "golden_runs"
RUNS = sorted(json.loads((GOLDEN / "manifest.json").read_text(encoding="utf-8"))["runs"])


def _stored(run_id: str) -> dict[str, object]:
    return json.loads((GOLDEN / run_id / "show.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


@pytest.mark.parametrize("run_id", RUNS)
@pytest.mark.parametrize("strict", [False, True])
def test_golden_runs_line_names_their_exit_code(run_id: str, strict: bool) -> None:
    results = _stored(run_id)
    overall = overall_verdict([results], strict=strict)
    code = results_exit_code([results], strict=strict)
    assert overall.exit_code == code
    assert f" · exit {code} ({'fail' if code else 'pass'}) · " in overall.line
    assert len(overall.line) <= 80
    statuses = RunResult.from_json(results).statuses()
    assert overall.figures == len(statuses)


def test_every_golden_run_together() -> None:
    overall = overall_verdict([_stored(r) for r in RUNS])
    assert overall.status is Status.VIOLATION and overall.exit_code == 5
    assert overall.line.startswith("verdict: VIOLATION · exit 5 (fail) · ")


class _Fake(RunResult):
    """A run whose statuses are given (the mixes below)."""

    def __init__(self, statuses: list[Status]) -> None:
        super().__init__()
        object.__setattr__(self, "_given", statuses)

    def statuses(self) -> list[Status]:
        return list(self._given)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("statuses", "strict", "start", "code"),
    [
        ([Status.OK] * 4, False, "verdict: consistent · exit 0 (pass) · all 196 figures", 0),
        ([Status.OK, Status.INCONCLUSIVE], False, "verdict: no violation seen · exit 0", 0),
        ([Status.OK, Status.INCONCLUSIVE], True, "verdict: INCONCLUSIVE · exit 3 (fail)", 3),
        ([Status.INCONCLUSIVE, Status.NONCONFORMING], False, "verdict: NONCONFORMING · exit 4", 4),
        ([Status.BUG, Status.NONCONFORMING], False, "verdict: BUG · exit 5 (fail) · 1 of 2", 5),
        ([Status.VIOLATION, Status.BUG], False, "verdict: VIOLATION · exit 5 (fail) · 1 of 2", 5),
        ([], False, "verdict: none · exit 0", 0),
    ],
)
def test_mixes(statuses: list[Status], strict: bool, start: str, code: int) -> None:
    overall = overall_verdict([_Fake(statuses * 49)], strict=strict)
    assert overall.line.startswith(start.replace("1 of 2", "49 of 98")), overall.line
    assert overall.exit_code == code
    assert len(overall.line) <= 80, overall.line


def test_html_opens_with_the_same_line() -> None:
    overall = overall_verdict([_stored("golden-broken-bb")])
    page = _overall_html(overall)
    assert "badge violation" in page and "exit 5 (fail)" in page
    assert _overall_html(overall_verdict([])) == ""
