"""``dpicl calibrate`` asks the mechanism registry: every registered mechanism prints the
record a context with the given settings would store (DPS-MOZO: eps0 or beta for a token
count), and a bad or foreign option exits 2 naming it. The plug-in case is in
test_mechanism_registry.py (a mechanism installed from outside)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpicl.cli import app
from dpicl.mechanisms.esa.release import esa_sensitivity
from dpicl.mechanisms.voting.release import VOTING_SENSITIVITY
from dpicl.privacy.calibration import epsilon_exact, sigma_for


def calibrate(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["calibrate", *args])
    return res.exit_code, res.output


def printed(*args: str) -> dict[str, Any]:
    code, out = calibrate(*args)
    assert code == 0, out
    found: dict[str, Any] = json.loads(out)
    return found


def test_voting_prints_sigma_and_exact_epsilon() -> None:
    out = printed("--mechanism", "voting", "--epsilon", "2", "--delta", "1e-6")
    sigma = sigma_for(2.0, 1e-6, VOTING_SENSITIVITY, "classic")
    assert out["mechanism"] == "voting" and out["calibration"] == "classic"
    assert out["sigma"] == pytest.approx(sigma, rel=1e-12)
    assert out["epsilon_exact"] == pytest.approx(epsilon_exact(sigma, VOTING_SENSITIVITY, 1e-6))
    assert "partition_seed" not in out  # drawn per context, never a fixed default


def test_esa_reads_partitions_sensitivity_and_calibration() -> None:
    out = printed(
        "--mechanism", "esa", "--epsilon", "1", "--delta", "1e-5", "--partitions", "8",
        "--sensitivity", "original", "--calibration", "analytic",
    )  # fmt: skip
    sens = esa_sensitivity(8, "original")
    assert out["partitions"] == 8 and out["sensitivity"] == sens
    assert out["sigma"] == pytest.approx(sigma_for(1.0, 1e-5, sens, "analytic"), rel=1e-12)
    tight = printed("--mechanism", "esa", "--epsilon", "1", "--delta", "1e-5")
    assert tight["sensitivity"] == esa_sensitivity(10, "tight")  # the settings' defaults


def test_dps_mozo_paper_mode_prints_beta() -> None:
    out = printed(
        "--mechanism", "dps-mozo", "--guarantee", "paper", "--epsilon", "1", "--delta", "1e-5",
        "--tokens", "4800", "--sample-rate", "0.004",
    )  # fmt: skip
    assert out["guarantee"].startswith("paper") and out["beta"] > 0 and out["alpha"] >= 2


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--mechanism", "votin", "--epsilon", "1"], "'votin'"),
        (["--mechanism", "public", "--epsilon", "1"], "'public'"),
        (["--mechanism", "voting", "--epsilon", "-1"], "--epsilon"),
        (["--mechanism", "voting", "--epsilon", "1", "--delta", "2"], "--delta"),
        (["--mechanism", "esa", "--epsilon", "1", "--partitions", "100000"], "100000"),
        (["--mechanism", "esa", "--epsilon", "1", "--sensitivity", "loose"], "'loose'"),
        (["--mechanism", "voting", "--epsilon", "1", "--tokens", "9"], "--tokens does not"),
        (["--mechanism", "voting", "--epsilon", "1", "--set", "temperature"], "'temperature'"),
        (["--mechanism", "voting", "--epsilon", "1", "--set", "temperature=-1"], "-1"),
        (["--mechanism", "dps-mozo", "--epsilon", "1", "--delta", "1e-5"], "--tokens"),
        (
            [
                "--mechanism",
                "dps-mozo",
                "--epsilon",
                "1",
                "--delta",
                "1e-5",
                "--tokens",
                "9",
                "--sample-rate",
                "1.5",
            ],
            "1.5",
        ),
    ],
)
def test_bad_options_exit_2_naming_the_value(args: list[str], names: str) -> None:
    code, out = calibrate(*args)
    assert code == 2 and names in out, out


def test_set_passes_any_other_setting() -> None:
    out = printed("--mechanism", "voting", "--epsilon", "1", "--set", "temperature=0.5")
    assert out["temperature"] == 0.5


def test_an_unknown_mechanism_is_not_installed_here_not_on_a_server() -> None:
    """calibrate runs offline: an unknown name is "not installed in this environment", with
    the plug-in's install step (issue 39: it said "on this server")."""
    code, out = calibrate("--mechanism", "no-such-mechanism", "--epsilon", "1")
    assert code == 2 and "'no-such-mechanism'" in out and "server" not in out, out
    assert "installed" in out and "pip install" in out and "voting" in out


# Issue 48, item 4: the command takes the mechanism's own settings, whatever they are, and
# knows none of them: --settings (a JSON object, the `mechanism` of POST /v1/contexts),
# --set KEY=VALUE, or --KEY VALUE (the form it took before, still served).

ESA_SETTINGS = {
    "name": "esa",
    "epsilon": 1,
    "delta": 1e-5,
    "partitions": 8,
    "sensitivity": "original",
    "calibration": "analytic",
}
ESA_FLAGS = (
    "--mechanism", "esa", "--epsilon", "1", "--delta", "1e-5", "--partitions", "8",
    "--sensitivity", "original", "--calibration", "analytic",
)  # fmt: skip


def test_the_command_declares_no_setting_of_any_mechanism() -> None:
    import typer.main

    command: Any = typer.main.get_command(app)
    declared = {p.name for p in command.commands["calibrate"].params}
    assert declared == {"mechanism", "settings", "set_"}, declared


def test_settings_json_flags_and_set_give_the_same_record(tmp_path: Path) -> None:
    by_flags = printed(*ESA_FLAGS)
    assert printed("--settings", json.dumps(ESA_SETTINGS)) == by_flags
    body = tmp_path / "esa.json"
    body.write_text(json.dumps(ESA_SETTINGS))
    assert printed("--settings", f"@{body}") == by_flags
    sets = [f"--set={k}={json.dumps(v)}" for k, v in ESA_SETTINGS.items() if k != "name"]
    assert printed("--mechanism", "esa", *sets) == by_flags
    equals = [f"--{k}={v}" for k, v in ESA_SETTINGS.items() if k != "name"]
    assert printed("--mechanism", "esa", *equals) == by_flags
    # Later sources win: --settings, then --KEY VALUE, then --set.
    again = printed(
        "--settings", json.dumps(ESA_SETTINGS), "--partitions", "4", "--set", "partitions=6"
    )
    assert again["partitions"] == 6


MOZO = ("--mechanism", "dps-mozo", "--epsilon", "1", "--delta", "1e-5")


def test_a_mechanisms_own_planning_options_reach_it() -> None:
    # DPS-MOZO's planning options (tokens, sample_rate) are its own: the command only
    # hands them on, typed as JSON reads them.
    out = printed(
        "--mechanism", "dps-mozo", "--set", "epsilon=1", "--set", "delta=1e-5",
        "--set", "tokens=4800", "--set", "sample_rate=0.004",
    )  # fmt: skip
    assert out["guarantee"] == "proven" and out["mechanism"] == "dps-mozo"


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--settings", "[1]"], "JSON object"),
        (["--settings", "{"], "not JSON"),
        (["--settings", "@/no/such/file.json"], "cannot read"),
        (["--settings", '{"epsilon": 1}'], "--mechanism NAME"),
        (["--mechanism", "voting", "--settings", '{"name": "esa"}'], "'esa'"),
        (["--mechanism", "voting", "--epsilon"], "--epsilon needs a value"),
        (["--mechanism", "voting", "stray", "--epsilon", "1"], "'stray'"),
        (["--mechanism", "voting", "--set", "epsilon=1", "--set", "=2"], "'=2'"),
        (["--settings", '{"name": "voting", "epsilon": 1, "sigma": 3}'], "--sigma does not"),
        ([*MOZO, "--tokens", "x", "--sample-rate", "0.1"], "'x'"),
        ([*MOZO, "--tokens", "9.5", "--sample-rate", "0.1"], "9.5"),
        ([*MOZO, "--tokens", "9", "--sample-rate", "often"], "'often'"),
    ],
)
def test_bad_settings_exit_2_naming_them(args: list[str], names: str) -> None:
    code, out = calibrate(*args)
    assert code == 2 and names in out, out
