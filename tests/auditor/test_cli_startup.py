"""``dpicl-audit --help`` stays fast (issue 45): importing the CLI imports no command's
module, so neither the plan, the estimators, scipy nor dp_accounting; the command list is
the commands' own; and the choices of every option print whole at 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer._click import Context
from typer.core import TyperGroup
from typer.testing import CliRunner

from dpicl_audit.cli import app
from dpicl_audit.cli.lazy import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
#: What the CLI's start must not import: each one alone cost 0.2-1.1 s on 2 cores.
HEAVY = ("scipy", "dp_accounting", "dpicl_audit.plan", "dpicl_audit.estimators", "sqlalchemy")

_PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {roots}
                        or m.startswith(("dpicl_audit.plan", "dpicl_audit.estimators")))))
"""


def _modules_after(body: str) -> list[str]:
    roots = {name for name in HEAVY if "." not in name}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "services"), str(ROOT / "auditor"), str(ROOT)])
    env["COLUMNS"] = "80"
    code = _PROBE.format(body=body, roots=sorted(roots))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_importing_the_cli_imports_nothing_heavy() -> None:
    assert _modules_after("import dpicl_audit.cli") == []


def test_help_imports_nothing_heavy() -> None:
    body = (
        "import contextlib, io\n"
        "from dpicl_audit.cli import app\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        app(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert 'utility' in out.getvalue(), out.getvalue()\n"
    )
    assert _modules_after(body) == []


def test_the_probe_sees_heavy_imports() -> None:
    # The check above can fail: running a command imports the plan and scipy.
    body = "import dpicl_audit.cli.audit\n"
    found = _modules_after(body)
    assert "scipy" in found and "dpicl_audit.plan" in found


def test_command_list_is_each_commands_own_help() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    ctx = Context(group)
    assert list(COMMANDS) == group.list_commands(ctx)[: len(COMMANDS)]
    for name, entry in COMMANDS.items():
        command = group.get_command(ctx, name)
        assert command is not None and command.name == name
        first = " ".join((command.help or "").split("\n\n")[0].split())
        assert first == entry.help, name


def test_commands_run_after_a_lazy_start(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    result = CliRunner().invoke(
        app,
        ["divergence", "--h1", "3,1", "--h0", "1,3", "--sigma", "1", "--orders", "2", "--json"],
    )
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["list", "--db", db])
    assert result.exit_code == 0 and "no trial log" in result.output
    result = CliRunner().invoke(app, ["nosuch"])
    assert result.exit_code == 2 and "nosuch" in result.output


@pytest.mark.parametrize("command", list(dict.fromkeys(COMMANDS)))
def test_help_at_80_columns_prints_every_choice_whole(command: str) -> None:
    env = {"COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    result = CliRunner().invoke(app, [command, "--help"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert all(len(line) <= 80 for line in text.splitlines()), command
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    ctx = Context(group)
    click_command = group.get_command(ctx, command)
    assert click_command is not None
    words = set(re.findall(r"[\w.:-]+", text))
    for param in click_command.params:
        shown = getattr(param, "display_type_rich", None)
        metavar = shown(Context(click_command, parent=ctx)) if shown else None
        if getattr(param, "hidden", False) or not metavar or "|" not in metavar:
            continue
        for choice in re.findall(r"[\w.:-]+", metavar):
            assert choice in words, f"{command} {param.name}: {choice!r} split in {metavar}"
