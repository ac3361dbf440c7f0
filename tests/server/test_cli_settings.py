"""``dpicl serve`` and ``dpicl migrate`` with settings that cannot work: exit 2 with the
variable (or flag) and the value named, never a pydantic or SQLAlchemy traceback, never a
server on another port, and never a secret echoed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpicl.cli import app


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        # uvicorn served 99999 on port 34463 (modulo 65536); -1 failed after start-up.
        (["serve", "--port", "99999"], {}, "--port: Input should be less than or equal to 65535"),
        (["serve", "--port", "-1"], {}, "--port: Input should be greater than or equal to 0"),
        (["serve"], {"DPICL_PORT": "abc"}, "DPICL_PORT: Input should be a valid integer"),
        (["serve"], {"DPICL_LOG_LEVEL": "loud"}, "DPICL_LOG_LEVEL: Input should be 'critical'"),
        (["migrate"], {"DPICL_MAX_BODY_BYTES": "-5"}, "DPICL_MAX_BODY_BYTES: Input should be"),
        (["migrate"], {"DPICL_BODY_TIMEOUT_S": "0"}, "DPICL_BODY_TIMEOUT_S: Input should be"),
        (["migrate"], {"DPICL_MAX_HEADER_BYTES": "10"}, "DPICL_MAX_HEADER_BYTES: Input should"),
        (["migrate"], {"DPICL_DATABASE_URL": "not a url"}, "DPICL_DATABASE_URL: Value error"),
    ],
)
def test_bad_settings_are_named(
    args: list[str], env: dict[str, str], said: str, tmp_path: Path
) -> None:
    base = {"DPICL_ENGINE": "oracle", "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/x.db"}
    res = CliRunner().invoke(app, args, env=base | env)
    assert res.exit_code == 2, res.output
    assert said in res.output
    assert "Traceback" not in res.output


def test_a_bad_database_url_is_not_echoed() -> None:
    # A URL carries a password: the error names the variable, not its value.
    res = CliRunner().invoke(app, ["migrate"], env={"DPICL_DATABASE_URL": "pw=hunter2 oops"})
    assert res.exit_code == 2, res.output
    assert "DPICL_DATABASE_URL" in res.output and "hunter2" not in res.output


def test_log_levels_are_read_in_either_case() -> None:
    from dpicl.config import Settings

    assert Settings(log_level="DEBUG").log_level == "debug"  # type: ignore[arg-type]


def test_a_database_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    # "cannot migrate the database schema (OperationalError / OperationalError)" said
    # neither which database nor where.
    url = f"sqlite:///{tmp_path}"  # a directory
    res = CliRunner().invoke(app, ["migrate"], env={"DPICL_DATABASE_URL": url})
    assert res.exit_code == 2, res.output
    assert f"cannot migrate the database schema at {url}" in res.output
