"""The dpicl-audit command line: estimate, list, show, report wiring, errors, and full runs
against a real oracle server on a socket."""

from __future__ import annotations

import json
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scipy import stats
from typer.testing import CliRunner

from dpicl_audit.cli import app
from dpicl_audit.store import TrialStore
from tests.servers import ADMIN, USER, ThreadServer, free_port

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env=env, catch_exceptions=False)


# ------------------------------------------------------------------ estimate


def _reference(tp: int, fn: int, fp: int, tn: int, delta: float, conf: float) -> dict[str, float]:
    """Closed forms, computed here with scipy only (not the auditor's estimators)."""
    c = 1 - (1 - conf) / 2  # Bonferroni over the two one-sided intervals
    fpr_u = 1.0 if fp == fp + tn else float(stats.beta.ppf(c, fp + 1, tn))
    fnr_u = 1.0 if fn == tp + fn else float(stats.beta.ppf(c, fn + 1, tp))
    mu = max(0.0, float(stats.norm.ppf(1 - fnr_u) - stats.norm.ppf(fpr_u)))
    classic = max(
        0.0,
        math.log((1 - delta - fnr_u) / fpr_u),
        math.log((1 - delta - fpr_u) / fnr_u),
    )
    return {"mu_lower": mu, "epsilon_lower_classic": classic}


def _gdp_delta(eps: float, mu: float) -> float:
    return float(
        stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    )


@pytest.mark.parametrize(
    ("tp", "fn", "fp", "tn", "delta", "conf"),
    [
        (900, 100, 100, 900, 1e-5, 0.95),
        (4000, 1000, 300, 4700, 1e-6, 0.9),
        (60, 40, 40, 60, 1e-5, 0.95),
    ],
)
def test_estimate_matches_closed_forms(
    tp: int, fn: int, fp: int, tn: int, delta: float, conf: float
) -> None:
    result = invoke(
        "estimate",
        *("--tp", str(tp), "--fn", str(fn), "--fp", str(fp), "--tn", str(tn)),
        *("--delta", str(delta), "--confidence", str(conf)),
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    ref = _reference(tp, fn, fp, tn, delta, conf)
    assert out["mu_lower"] == pytest.approx(ref["mu_lower"], rel=1e-7)
    assert out["epsilon_lower_classic"] == pytest.approx(ref["epsilon_lower_classic"], rel=1e-7)
    # epsilon_lower is the epsilon at which mu_lower-GDP has exactly the target delta
    if out["mu_lower"] > 0.3:
        assert _gdp_delta(out["epsilon_lower"], out["mu_lower"]) == pytest.approx(delta, rel=1e-4)
    assert {"tp", "fn", "fp", "tn", "confidence", "delta"} <= set(out)


def test_estimate_rejects_bad_counts() -> None:
    result = invoke("estimate", "--tp", "1", "--fn", "0", "--fp", "0", "--tn", "0")
    assert result.exit_code == 1
    assert "at least one trial" in result.stderr


# ------------------------------------------------------------------ offline commands


def test_list_and_show_on_empty_log(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/audit.db"
    result = invoke("list", "--db", db, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == []
    result = invoke("show", "nope", "--db", db)
    assert result.exit_code == 1 and "no run 'nope'" in result.stderr
    result = invoke("resume", "nope", "--db", db, "--admin-token", "x")
    assert result.exit_code == 1 and "no run 'nope'" in result.stderr


def test_bad_plans_exit_1_naming_the_field(tmp_path: Path) -> None:
    result = invoke("run", "--db", str(tmp_path / "a.db"), "--trials", "2", "--admin-token", "x")
    assert result.exit_code == 1 and "trials" in result.stderr
    plan = tmp_path / "p.toml"
    plan.write_text("[mechanism]\nepsilons = [0]\n")
    result = invoke("run", "--plan", str(plan), "--db", str(tmp_path / "a.db"))
    assert result.exit_code == 1 and "mechanism.epsilons" in result.stderr
    result = invoke("run", "--epsilons", "1,x")
    assert result.exit_code == 2
    # --split reaches the plan (issue 35: the white-box selection share had no flag)
    result = invoke("run", "--db", str(tmp_path / "a.db"), "--split", "1.5", "--admin-token", "x")
    assert result.exit_code == 1 and "split" in result.stderr


def test_run_needs_admin_token(tmp_path: Path) -> None:
    result = invoke("run", "--db", str(tmp_path / "a.db"), "--url", "http://127.0.0.1:9", env={})
    assert result.exit_code == 1 and "admin token" in result.stderr


def test_unreachable_server_fails_cleanly(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = invoke(
        "run",
        *("--db", str(tmp_path / "a.db"), "--url", f"http://127.0.0.1:{port}"),
        *("--admin-token", "x", "--timeout", "2", "--retries", "1", "--no-progress"),
        *("--out", str(tmp_path / "runs")),
    )
    assert result.exit_code == 1
    assert "failed after" in result.stderr


#: A run's exit status: 0 consistent, 3 INCONCLUSIVE, 4 NONCONFORMING, 5 VIOLATION or BUG
#: (verdicts.EXIT_CODES); these small runs may be any but 4 and 5 on the honest oracle.
VERDICT_EXITS = (0, 3)


def test_report_is_wired_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str, Path]] = []
    fake = types.ModuleType("dpicl_audit.report")

    def write_report(run_id: str, db_url: str, out_dir: Path, strict: bool = False) -> Path:
        assert strict is False  # --strict phrases the report's verdict line
        calls.append((run_id, db_url, out_dir))
        return out_dir / run_id / "report.html"

    fake.write_report = write_report  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dpicl_audit.report", fake)
    (tmp_path / "x.db").touch()  # report reads a log; it never creates one
    result = invoke("report", "r1", "--db", str(tmp_path / "x.db"), "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert calls == [("r1", f"sqlite:///{tmp_path}/x.db", tmp_path)]
    assert "report.html" in result.stdout


# ------------------------------------------------------------------ against a real server


def _server_available() -> str | None:
    try:
        from dpicl.api.app import build_app  # noqa: F401
        from dpicl.config import Settings  # noqa: F401
    except Exception as exc:
        return f"the dpicl server app is not importable yet: {exc}"
    return None


@pytest.fixture(scope="module")
def oracle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    reason = _server_available()
    if reason:
        pytest.skip(reason)
    with ThreadServer(tmp_path_factory.mktemp("srv") / "server.db") as srv:
        yield srv


@pytest.mark.long
def test_run_show_list_resume_bootstrap(oracle_server: ThreadServer, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/audit.db"
    out = tmp_path / "runs"
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    common = ("--db", db, "--out", str(out), "--url", oracle_server.url, "--no-progress")
    plan = tmp_path / "plan.toml"
    plan.write_text(
        "trials = 60\nthreat_model = 'white-box'\nseed = 3\n"
        "[mechanism]\nepsilons = [2, 8]\npartitions = 4\nshots = 2\n"
    )
    result = invoke(
        "run", "--plan", str(plan), *common, "--run-id", "cli-run", "--trials", "80", env=env
    )
    # 60 trials cannot reach half of epsilon_exact: the verdict says INCONCLUSIVE, not "ok";
    # the gate lists it with the trials it needs and passes it (exit 0) unless --strict.
    assert result.exit_code == 0, result.output
    assert "white" in result.stdout and "black" in result.stdout
    assert "INCONCLUSIVE" in result.stdout
    # One line first: the verdict and the exit status in words; each finding once (issue 45).
    first = result.stdout.splitlines()[0]
    assert first.startswith("verdict: no violation seen · exit 0 (pass) · "), first
    assert "(--strict: 3)" in first
    for setting in ("eps=2", "eps=8"):
        found = [line for line in result.stdout.splitlines() if line.startswith(setting)]
        assert len(found) <= 2, found  # one per threat model
    assert "INCONCLUSIVE" not in result.stderr
    saved = json.loads((out / "cli-run" / "results.json").read_text())
    assert [s["setting"] for s in saved["settings"]] == ["eps=2", "eps=8"]
    assert all(s["trials"] == 80 for s in saved["settings"])  # the flag beat the file's 60
    assert saved["plan"]["target"]["admin_token"] == "**********"
    assert ADMIN not in (out / "cli-run" / "results.json").read_text()

    result = invoke("list", "--db", db, "--json")
    rows = json.loads(result.stdout)
    assert rows[0]["id"] == "cli-run" and rows[0]["status"] == "completed"
    assert rows[0]["trials_logged"] == rows[0]["trials_planned"] == 160

    result = invoke("show", "cli-run", "--db", db, "--json")
    assert json.loads(result.stdout)["run_id"] == "cli-run"

    # resuming a finished run runs nothing and keeps the log as it was; --strict fails
    # the figures without power (exit 3), as report --strict does
    result = invoke("resume", "cli-run", *common, "--strict", env=env)
    assert result.exit_code == 3, result.output
    assert result.stdout.startswith("verdict: INCONCLUSIVE · exit 3 (fail) · ")
    result = invoke("report", "cli-run", "--db", db, "--out", str(out), "--strict")
    assert result.exit_code == 3, result.output
    store = TrialStore(db)
    assert store.trial_counts("cli-run") == {"eps=2": 80, "eps=8": 80}
    store.dispose()

    result = invoke(
        "bootstrap",
        *common,
        *("--run-id", "cli-boot", "--epsilons", "1,4", "--n-llm", "10", "--n-sample", "20000"),
        "--json",
        env=env,
    )
    assert result.exit_code in VERDICT_EXITS, result.output
    boot = json.loads(result.stdout)
    assert boot["kind"] == "bootstrap"
    assert [s["n_sample"] for s in boot["settings"]] == [20000, 20000]
    assert all(s["white_box"]["epsilon_lower"] > 0 for s in boot["settings"]), [
        {k: s["white_box"].get(k) for k in ("epsilon_lower", "threshold", "tpr", "fpr")}
        for s in boot["settings"]
    ]
    # The planning figure: real trials a run of this design needs (less at larger epsilon).
    need_1, need_4 = (s["real_trials_for_power"] for s in boot["settings"])
    assert need_1 > need_4 > 0
    result = invoke("show", "cli-boot", "--db", db)
    assert result.exit_code == 0, result.output
    assert f"eps=1: {need_1:,}, eps=4: {need_4:,}" in " ".join(result.stdout.split())

    # A real run planned from it: the bootstrap's count at epsilon 4, and both figures have
    # the power it promised (the margin covers the random draw of the worlds).
    result = invoke(
        "run",
        *common,
        *("--run-id", "cli-planned", "--epsilons", "4", "--threat-model", "white-box"),
        *("--trials-from", "cli-boot", "--json"),
        env=env,
    )
    assert result.exit_code in VERDICT_EXITS, result.output
    assert f"{need_4:,} trials per epsilon" in result.stderr
    (planned,) = json.loads(result.stdout)["settings"]
    assert planned["trials"] == need_4
    for threat in ("black_box", "white_box"):
        assert planned[threat]["verdict"]["max_reachable"] >= 0.5 * planned["epsilon_exact"]
    refused = {
        "not a bootstrap": ("--trials-from", "cli-run", "--epsilons", "4"),
        "has no epsilon 2": ("--trials-from", "cli-boot", "--epsilons", "2"),
        "not both": ("--trials-from", "cli-boot", "--epsilons", "4", "--trials", "50"),
    }
    for why, flags in refused.items():
        result = invoke("run", *common, *flags, env=env)
        assert result.exit_code in (1, 2) and why in result.stderr, (why, result.output)
    result = invoke("bootstrap", *common, "--trials-from", "cli-boot", env=env)
    assert result.exit_code == 2 and "only for run" in result.stderr


def test_resume_without_token_is_refused(oracle_server: ThreadServer, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/audit.db"
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN}
    result = invoke(
        "run",
        *("--db", db, "--out", str(tmp_path), "--url", oracle_server.url, "--no-progress"),
        *("--trials", "10", "--epsilons", "8", "--run-id", "r"),
        env=env,
    )
    assert result.exit_code in VERDICT_EXITS, result.output
    result = invoke("resume", "r", "--db", db, env={})
    assert result.exit_code == 1 and "admin token" in result.stderr


def test_list_never_creates_a_trial_log(tmp_path: Path) -> None:
    db = tmp_path / "nothing" / "audit.db"
    result = invoke("list", "--db", str(db))
    assert result.exit_code == 0 and "no trial log" in result.stdout
    result = invoke("show", "r", "--db", str(db))
    assert result.exit_code == 1 and "no trial log" in result.stderr
    result = invoke("report", "r", "--db", str(db), "--out", str(tmp_path))
    assert result.exit_code == 1
    assert not db.exists() and not db.parent.exists()


def test_help_shows_every_default() -> None:
    import re

    for command in ("run", "bootstrap", "resume", "list", "show", "report", "estimate"):
        text = invoke(command, "--help", env={"COLUMNS": "200"}).stdout
        options = re.findall(r"│ \*?\s*(--[a-z][a-z0-9-]*)", text)
        assert options, command
        blocks = re.split(r"\n│ \*?\s*(?=--)", text)
        for block in blocks[1:]:
            name = block.split()[0]
            if name in ("--help",) or (
                command == "estimate" and name in ("--tp", "--fn", "--fp", "--tn")
            ):
                continue
            if (
                block.split()[1:2] == ["TEXT"]
                and command == "resume"
                and name
                in (
                    "--url",
                    "--admin-token",
                    "--api-key",
                )
            ):
                continue  # credentials and the server's address: no default to show
            flat = " ".join(block.split())
            assert "default" in flat or "env var" in flat, f"{command} {name}: {flat[:160]}"


def test_verify_prints_and_stores_its_tail_gap_run(
    oracle_server: ThreadServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run --profile verify --json`` prints one document with the tail-gap run inside
    (``verify.tail_gap``), and stores it with the run: ``show`` and ``results.json`` agree."""
    monkeypatch.setattr("dpicl_audit.pipeline.profiles.TAIL_TRIALS", 40)  # 3,000 in earnest
    db = f"sqlite:///{tmp_path}/audit.db"
    out = tmp_path / "runs"
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    common = ("--db", db, "--out", str(out), "--url", oracle_server.url, "--no-progress")
    args = ("--profile", "verify", "--epsilons", "8", "--trials", "20", "--seed", "5")
    result = invoke("run", *args, *common, "--run-id", "v", "--json", env=env)
    assert result.exit_code in VERDICT_EXITS, result.output
    printed = json.loads(result.stdout)
    tail = printed["verify"]["tail_gap"]
    assert printed["run_id"] == "v" and tail["run_id"] == "v-tail"
    assert tail["plan"]["design"] == "paper" and tail["settings"][0]["trials"] == 40
    shown = json.loads(invoke("show", "v", "--db", db, "--json").stdout)
    assert shown == printed == json.loads((out / "v" / "results.json").read_text())
    alone = json.loads(invoke("show", "v-tail", "--db", db, "--json").stdout)
    assert alone == tail


def test_resume_hint_names_the_token_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command printed after Ctrl-C works as printed (issue 39, item 13): tokens are never
    logged, so it names the variable resume reads the admin token from, never the token."""
    from dpicl_audit.cli.common import ADMIN_TOKEN_VAR
    from dpicl_audit.cli.stopping import resume_command

    monkeypatch.delenv(ADMIN_TOKEN_VAR, raising=False)
    hint = resume_command("r 1", "sqlite:///a.db")
    assert hint.startswith("dpicl-audit resume 'r 1' --db sqlite:///a.db after export ")
    assert f"{ADMIN_TOKEN_VAR}=..." in hint
    monkeypatch.setenv(ADMIN_TOKEN_VAR, "secret-token")
    hint = resume_command("r1", "sqlite:///a.db")
    assert hint.startswith("dpicl-audit resume r1 --db sqlite:///a.db (")
    assert ADMIN_TOKEN_VAR in hint and "secret-token" not in hint
