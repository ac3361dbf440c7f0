"""``run --help`` and ``bootstrap --help`` at 80 columns: every option's help whole.

Rich cuts a word wider than its column with "…"; at 80 columns the flat option list cut 15
values (defaults, environment variables, option names). The options are grouped into
panels (cli/audit_options.py) so that each panel's columns fit; this reads each option's
help column back out of the rendering and compares it with the option's help text.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from dpicl_audit.cli import app

runner = CliRunner()


def _rendered(command: str, columns: int) -> str:
    env = {"COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}
    result = runner.invoke(app, [command, "--help"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def _rows(text: str) -> dict[str, list[str]]:
    """Each option's lines in the panels, by its long name (a row starts with ``│ --``)."""
    rows: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        start = re.match(r"│ (?:\* )?(--[a-z][a-z0-9-]*)", line)  # not a wrapped "--x" in help
        if start:
            current = rows.setdefault(start.group(1), [])
        elif not line.startswith("│"):
            current = None  # a panel's border ends the row
        if current is not None:
            current.append(line.rstrip().removesuffix("│"))
    return rows


def _help_column(lines: list[str], first_word: str, name: str) -> str:
    """The help column's text of one row, its wrapped lines joined."""
    at = lines[0].index(first_word, len("│ ") + len(name))
    return " ".join(" ".join(line[at:] for line in lines).split())


@pytest.mark.parametrize("command", ["run", "bootstrap"])
def test_help_fits_80_columns_with_every_value_whole(command: str) -> None:
    text = _rendered(command, 80)
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    rows = _rows(text)
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    shown = [p for p in click_command.params if not p.hidden]
    hidden = [p for p in click_command.params if p.hidden]
    assert len(shown) > 40  # every option of the command, not a subset
    for param in shown:
        name = next(o for o in param.opts if o.startswith("--"))
        assert name in rows, f"{command} {name} not shown"
        if name == "--help":
            continue
        help_text = " ".join((param.help or "").split())
        shown_help = _help_column(rows[name], help_text.split()[0], name)
        assert help_text in shown_help, f"{command} {name}: {shown_help!r}"
        if param.envvar:  # a credential has no default to show: its variable(s) instead
            names = param.envvar if isinstance(param.envvar, str) else ", ".join(param.envvar)
            assert f"[env var: {names}]" in shown_help, f"{command} {name}"
        else:
            assert "default" in shown_help, f"{command} {name}: no default in {shown_help!r}"
    for param in hidden:
        assert param.opts[0] not in rows, f"{command} {param.opts[0]} should be hidden"


def test_help_groups_options_into_panels() -> None:
    text = _rendered("run", 80)
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels[:3] == ["Options", "Plan and server", "What is audited"], panels
    assert {"Trials and statistics", "Output", "ESA", "DPS-MOZO"} <= set(panels)
