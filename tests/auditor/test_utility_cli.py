"""`dpicl-audit utility`'s refusals before anything is sent (exit status 2, the value named)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpicl_audit.cli import app


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--partitions", "32", "--exemplars", "16"], "larger than the exemplars per context"),
        (["--epsilons", "0"], "finite number above 0"),
        (["--partitions", "2.5"], "whole numbers"),
        (["--queries", "0"], "queries"),
        (["--label-calibration", "batch"], "label_calibration: Input should be"),
        (["--label-calibration", "batch"], "(got 'batch')"),
    ],
)
def test_bad_plans_exit_2_naming_the_value(args: list[str], said: str, tmp_path: Path) -> None:
    db = ["--db", str(tmp_path / "a.db"), "--admin-token", "x"]
    result = CliRunner().invoke(app, ["utility", *args, *db])
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())
    assert not (tmp_path / "a.db").exists()  # refused before the log was opened


def test_without_a_way_to_create_contexts_it_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["utility", "--db", str(tmp_path / "a.db")], env={"DPICL_AUDIT_ADMIN_TOKEN": ""}
    )
    assert result.exit_code == 2 and "--admin-token" in result.output


def test_resume_takes_no_plan_flags(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["utility", "--resume", "r1", "--queries", "5", "--db", str(tmp_path / "a.db")]
    )
    assert result.exit_code == 2 and "--queries" in result.output
