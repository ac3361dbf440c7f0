"""`dpicl-audit utility` end to end against real `dpicl serve` processes: interrupted with
Ctrl-C and killed, resumed to the end with every query logged exactly once, its intervals and
ledger spend checked against an independent computation from the raw trial log, its contexts
deleted; through `--api openai` with a context hook; and on the bundled transformers model.

The oracle engine is deterministic apart from the DP noise, and nothing here asserts an
accuracy value: the checks are exact bookkeeping (counts, indices, intervals recomputed from
the log), so no check can fail by chance.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from scipy.stats import beta
from typer.testing import CliRunner

from dpicl_audit.cli import app
from tests.servers import ADMIN, ROOT, USER, oracle_server_env
from tests.signals import ctrl_c_reaches

pytestmark = pytest.mark.slow

QUERIES = 150
GRID = ("--epsilons", "1,8", "--partitions", "4", "--dataset", "news-mini")


def _cli() -> list[str]:
    return [sys.executable, "-m", "dpicl_audit.cli", "utility"]


def _logged(db_file: Path, run_id: str) -> int:
    """Trials logged so far, read with a plain connection (0 before the log exists)."""
    if not db_file.exists():
        return 0
    try:
        with sqlite3.connect(db_file, timeout=30) as c:
            row = c.execute("SELECT count(*) FROM trials WHERE run_id=?", (run_id,)).fetchone()
            return int(row[0])
    except sqlite3.OperationalError:  # the tables are not there yet
        return 0


def _labels_of(path: Path) -> list[str]:
    """A dataset's labels in the auditor's order: first appearance in the file."""
    with path.open() as f:
        return list(dict.fromkeys(json.loads(line)["output"] for line in f if line.strip()))


def _stop_when(
    proc: subprocess.Popen[str], ready: Callable[[], bool], sig: int, timeout: float = 180.0
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"finished before it could be stopped (rc {proc.returncode})")
        if ready():
            os.kill(proc.pid, sig)
            out, _ = proc.communicate(timeout=60)
            return out
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the stop condition was never reached")


def _independent(db_file: Path, run_id: str) -> dict[str, dict[str, Any]]:
    """Per cell, from the raw rows: queries, distinct indices, correct answers, the exact
    interval from beta quantiles (not the auditor's code), and the ledger's largest spend."""
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "idx": set(), "k": 0, "spent": None, "labels": set(), "right": 0}
    )
    with sqlite3.connect(db_file) as c:
        rows = c.execute(
            "SELECT setting, trial_index, decision, observation FROM trials WHERE run_id=?",
            (run_id,),
        ).fetchall()
    for setting, idx, decision, obs in rows:
        cell = out[setting]
        cell["n"] += 1
        cell["idx"].add(idx)
        cell["k"] += int(decision)
        o = json.loads(obs)
        cell["labels"].add(o.get("label"))
        # the answer against the dataset's label, read from the row, not the decision column
        cell["right"] += int(o.get("label") == o.get("expected"))
        spent = o.get("budget", {}).get("spent_epsilon")
        if spent is not None:
            cell["spent"] = max(cell["spent"] or 0.0, spent)
    for cell in out.values():
        n, k = cell["n"], cell["k"]
        cell["low"] = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
        cell["high"] = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return dict(out)


@pytest.mark.long
def test_utility_interrupted_killed_resumed_and_checked(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(oracle_server_env(tmp_path, whitebox="internal"))
    db_file = tmp_path / "audit.db"
    env = os.environ | {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    common = ["--db", str(db_file), "--out", str(tmp_path / "runs"), "--url", srv.url]
    common += ["--no-progress"]
    run_id = "u-kill"

    def spawn(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*_cli(), *args, *common],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            # Its Ctrl-C reaches it even where this process ignores SIGINT (tests.signals):
            # a run that never saw it finished and exited 0 in CI once.
            preexec_fn=ctrl_c_reaches,
        )

    # One in flight, so that the run is still asking when the Ctrl-C comes. (Its exit 0 once
    # in CI, at two in flight, was the Ctrl-C ignored, not the run's speed: _stop_when fails
    # on a run that ends before its signal.)
    first = spawn(*GRID, "--queries", str(QUERIES), "--run-id", run_id, "--concurrency", "1")
    out = _stop_when(first, lambda: _logged(db_file, run_id) >= 40, signal.SIGINT)
    assert first.returncode == 130, out
    assert "should take about" in out  # the time estimate came before the queries
    assert f"dpicl-audit utility --resume {run_id}" in out
    n1 = _logged(db_file, run_id)
    second = spawn("--resume", run_id)
    _stop_when(second, lambda: _logged(db_file, run_id) >= n1 + 60, signal.SIGKILL)
    assert n1 < _logged(db_file, run_id) < 4 * QUERIES
    final = subprocess.run(
        [*_cli(), "--resume", run_id, *common, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert final.returncode == 0, final.stderr
    results = json.loads(final.stdout)

    indep = _independent(db_file, run_id)
    cells = {c["setting"]: c for c in results["cells"]}
    assert set(indep) == {"eps=1,T=4", "eps=8,T=4", "few-shot", "zero-shot"}
    for name, got in indep.items():
        # every query exactly once: no lost or duplicated trial across Ctrl-C and SIGKILL
        assert got["n"] == QUERIES and got["idx"] == set(range(QUERIES)), name
        assert got["right"] == got["k"], name
        acc = cells[name]["accuracy"]
        assert acc["n"] == QUERIES and acc["value"] == pytest.approx(got["k"] / QUERIES)
        assert acc["low"] == pytest.approx(got["low"], abs=1e-9)
        assert acc["high"] == pytest.approx(got["high"], abs=1e-9)
        assert cells[name]["spent_epsilon"] == pytest.approx(got["spent"])
    # The zero-shot baseline came from POST /v1/zero-shot, which charges nothing. With no
    # exemplar to match, the oracle scores the first label highest on every query: so its
    # accuracy is the share of the held-out queries whose label is the first (read from the
    # dataset file, not the log).
    zero = cells["zero-shot"]
    assert "/v1/zero-shot" in zero["measured_by"] and "refused" not in zero
    assert zero["spent_epsilon"] is None and indep["zero-shot"]["spent"] is None
    first = _labels_of(ROOT / "auditor" / "dpicl_audit" / "data" / "news_mini.jsonl")[0]
    assert indep["zero-shot"]["labels"] == {first}
    assert "/v1/debug/classify" in cells["few-shot"]["measured_by"]
    # The ledger: 150 queries over 4 draws at epsilon 8 cost each draw's context more than
    # one answer (7.91 exact) and less than the budget the auditor gave it.
    assert 7.9 < cells["eps=8,T=4"]["spent_epsilon"] < 1000
    # The contexts the run created are gone from the server.
    listing = httpx.get(
        f"{srv.url}/v1/contexts?limit=200", headers={"Authorization": f"Bearer {ADMIN}"}
    ).json()["data"]
    assert not [c for c in listing if run_id in str(c.get("name"))]
    assert results["contexts_deleted"] == 4 * 4  # 4 draws x (2 private cells + 2 baselines)
    # Resuming a completed run asks nothing and reports the same.
    again = subprocess.run(
        [*_cli(), "--resume", run_id, *common, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert again.returncode == 0, again.stderr
    assert _logged(db_file, run_id) == 4 * QUERIES
    assert json.loads(again.stdout)["cells"] == results["cells"]


def test_utility_through_openai_with_a_context_hook(
    start_server: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    srv = start_server(oracle_server_env(tmp_path, whitebox="internal"))
    monkeypatch.setenv("HOOK_DPICL_URL", srv.url)
    monkeypatch.setenv("HOOK_DPICL_ADMIN", ADMIN)
    hook = f"{sys.executable} {ROOT / 'tests' / 'e2e' / 'openai_hook.py'}"
    db_file = tmp_path / "audit.db"
    args = [
        "utility",
        *("--dataset", "news-mini", "--epsilons", "8", "--partitions", "4", "--queries", "24"),
        *("--api", "openai", "--context-hook", hook, "--baseline-url", srv.url),
        *("--url", srv.url, "--db", str(db_file), "--out", str(tmp_path / "runs")),
        *("--run-id", "u-openai", "--no-progress", "--json"),
    ]
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads(result.stdout[result.stdout.index("{") :])
    cells = {c["setting"]: c for c in results["cells"]}
    indep = _independent(db_file, "u-openai")
    for name in ("eps=8,T=4", "few-shot", "zero-shot"):
        assert indep[name]["n"] == 24 == cells[name]["accuracy"]["n"]
        assert cells[name]["accuracy"]["low"] == pytest.approx(indep[name]["low"], abs=1e-9)
        assert cells[name]["accuracy"]["high"] == pytest.approx(indep[name]["high"], abs=1e-9)
    # The private answers came through chat completions with dpicl's cost extension: the
    # ledger's spend is read from it.
    assert cells["eps=8,T=4"]["spent_epsilon"] > 7.9
    assert "chat/completions" in cells["eps=8,T=4"]["measured_by"]
    # Both baselines came from the dpicl server beside the hook's deployment (--baseline-url).
    assert "/v1/zero-shot on the baseline server" in cells["zero-shot"]["measured_by"]
    assert not results["refused"]


def test_utility_through_openai_on_dpicl(start_server: Any, tmp_path: Path) -> None:
    """--api openai against dpicl itself (no hook): the private answers through chat
    completions, both baselines on the same server's native admin routes."""
    srv = start_server(oracle_server_env(tmp_path, whitebox="internal"))
    db_file = tmp_path / "audit.db"
    args = [
        "utility",
        *("--dataset", "news-mini", "--epsilons", "8", "--partitions", "2", "--queries", "16"),
        *("--api", "openai", "--url", srv.url, "--db", str(db_file)),
        *("--out", str(tmp_path / "runs"), "--run-id", "u-oa", "--no-progress", "--json"),
    ]
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    cells = {
        c["setting"]: c for c in json.loads(result.stdout[result.stdout.index("{") :])["cells"]
    }
    indep = _independent(db_file, "u-oa")
    for name in ("eps=8,T=2", "few-shot", "zero-shot"):
        assert indep[name]["n"] == 16 == cells[name]["accuracy"]["n"], name
        assert cells[name]["accuracy"]["value"] == pytest.approx(indep[name]["k"] / 16)
    assert "chat/completions" in cells["eps=8,T=2"]["measured_by"]
    # the same server's native route: the target, not "the baseline server" (issue 45)
    assert "/v1/zero-shot on the target (its native route)" in cells["zero-shot"]["measured_by"]
    # the majority-class baseline, from the logged labels
    majority = cells["majority"]
    assert majority["kind"] == "majority" and majority["accuracy"]["n"] == 16
    # `list` counts its LLM prompts (T per private answer, 1 per baseline answer) and says
    # that it went through the OpenAI API (issue 45: "calls 0", native and OpenAI alike)
    listed = CliRunner().invoke(app, ["list", "--db", str(db_file), "--json"])
    row = next(r for r in json.loads(listed.stdout) if r["id"] == "u-oa")
    assert row["llm_calls"] == 16 * 2 + 16 + 16 and row["api"] == "openai"
    text = CliRunner().invoke(app, ["list", "--db", str(db_file)], env={"COLUMNS": "80"})
    assert "OpenAI" in text.stdout


def _rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over lower-cased word tokens (Lin 2004), written apart from the auditor's:
    the LCS by memoised recursion instead of its row-by-row table."""
    c = re.findall(r"\w+", candidate.lower())
    r = re.findall(r"\w+", reference.lower())

    @functools.cache
    def lcs(i: int, j: int) -> int:
        if i == len(c) or j == len(r):
            return 0
        return lcs(i + 1, j + 1) + 1 if c[i] == r[j] else max(lcs(i + 1, j), lcs(i, j + 1))

    n = lcs(0, 0)
    return 0.0 if n == 0 else 2 * n / (len(c) + len(r))


def test_utility_generation_rouge_l_with_bootstrap_intervals(
    start_server: Any, tmp_path: Path
) -> None:
    """The generation path (ESA) end to end: ROUGE-L per answer recomputed from the logged
    text and reference, each cell's mean and percentile bootstrap interval recomputed from
    the log as docs/utility.md states them (2,000 resamples from numpy's default generator
    seeded [plan seed, 0xB007570E, cell position])."""
    srv = start_server(oracle_server_env(tmp_path, whitebox="internal"))
    db_file = tmp_path / "audit.db"
    args = [
        "utility",
        *("--dataset", "dialogsum-mini", "--epsilons", "8", "--partitions", "2"),
        *("--queries", "20", "--exemplars", "6", "--contexts", "2", "--max-tokens", "24"),
        *("--url", srv.url, "--db", str(db_file), "--out", str(tmp_path / "runs")),
        *("--run-id", "u-gen", "--no-progress", "--json"),
    ]
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads(result.stdout[result.stdout.index("{") :])
    assert results["metric"] == "rouge_l" and results["mechanism"] == "esa"
    with sqlite3.connect(db_file) as c:
        rows = c.execute(
            "SELECT setting, trial_index, score, observation FROM trials WHERE run_id=? "
            "ORDER BY setting, trial_index",
            ("u-gen",),
        ).fetchall()
    scores: dict[str, list[float]] = defaultdict(list)
    for setting, _, score, obs in rows:
        o = json.loads(obs)
        mine = _rouge_l(o["text"], o["reference"])
        assert score == pytest.approx(mine, abs=1e-12), (setting, o)
        scores[setting].append(mine)
    order = ["eps=8,T=2", "few-shot", "zero-shot"]
    assert [c["setting"] for c in results["cells"]] == order
    for k, cell in enumerate(results["cells"]):
        x = np.array(scores[cell["setting"]])
        assert x.size == 20
        rng = np.random.default_rng([2026, 0xB007570E, k])
        means = x[rng.integers(0, x.size, size=(2000, x.size))].mean(axis=1)
        low, high = np.quantile(means, [0.025, 0.975])
        got = cell["rouge_l"]
        assert got["method"] == "bootstrap" and got["n"] == 20
        assert got["value"] == pytest.approx(x.mean(), abs=1e-12)
        assert (got["low"], got["high"]) == pytest.approx((low, high), abs=1e-12)
        assert x.min() <= got["low"] <= got["value"] <= got["high"] <= x.max()
    # The oracle's zero-shot answer echoes the query (its first 24 words): the baseline
    # came from the context's template with no exemplar in it.
    for setting, _, _, obs in rows:
        if setting == "zero-shot":
            assert json.loads(obs)["route"].startswith("POST /v1/zero-shot")
    with sqlite3.connect(db_file) as c:
        pairs = c.execute(
            "SELECT query, observation FROM trials WHERE run_id='u-gen' AND setting='zero-shot'"
        ).fetchall()
    for query, obs in pairs:
        assert json.loads(obs)["text"].split() == query.split()[:24]


@pytest.mark.skipif(
    os.environ.get("DPICL_SKIP_MODEL_TESTS") == "1", reason="DPICL_SKIP_MODEL_TESTS=1"
)
@pytest.mark.long
def test_utility_on_the_bundled_model(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "transformers",
            "DPICL_WHITEBOX": "internal",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/server.db",
            "DPICL_TORCH_THREADS": "2",
        }
    )
    args = [
        "utility",
        *("--dataset", "bbc-news", "--epsilons", "8", "--partitions", "2", "--queries", "6"),
        *("--exemplars", "4", "--contexts", "1", "--concurrency", "1"),
        *("--url", srv.url, "--db", str(tmp_path / "a.db"), "--out", str(tmp_path / "runs")),
        *("--run-id", "u-model", "--no-progress", "--json"),
    ]
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads(result.stdout[result.stdout.index("{") :])
    cells = {c["setting"]: c for c in results["cells"]}
    assert cells["eps=8,T=2"]["accuracy"]["n"] == 6 == cells["few-shot"]["accuracy"]["n"]
    assert cells["zero-shot"]["accuracy"]["n"] == 6 and not results["refused"]
    indep = _independent(tmp_path / "a.db", "u-model")
    for name in ("few-shot", "zero-shot"):
        assert cells[name]["accuracy"]["high"] == pytest.approx(indep[name]["high"])
        assert indep[name]["right"] == indep[name]["k"]


@pytest.mark.parametrize(("whitebox", "said"), [("noisy", "DPICL_WHITEBOX=internal"), ("off", "")])
def test_the_non_private_baseline_needs_an_internal_white_box(
    start_server: Any, tmp_path: Path, whitebox: str, said: str
) -> None:
    srv = start_server(oracle_server_env(tmp_path, whitebox=whitebox))
    args = [
        "utility",
        *("--dataset", "news-mini", "--epsilons", "8", "--partitions", "2", "--queries", "8"),
        *("--url", srv.url, "--db", str(tmp_path / "a.db"), "--out", str(tmp_path / "runs")),
        *("--run-id", "u-wb", "--no-progress", "--json"),
    ]
    env = {"DPICL_AUDIT_ADMIN_TOKEN": ADMIN, "DPICL_AUDIT_API_KEY": USER}
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads(result.stdout[result.stdout.index("{") :])
    cells = {c["setting"]: c for c in results["cells"]}
    assert cells["eps=8,T=2"]["accuracy"]["n"] == 8
    assert cells["few-shot"]["queries"] == 0 and said in cells["few-shot"]["refused"]
    # nothing of the refused baseline stays in the log; the zero-shot baseline needs no
    # white-box level (POST /v1/zero-shot releases nothing private)
    assert _independent(tmp_path / "a.db", "u-wb").keys() == {"eps=8,T=2", "zero-shot"}
    assert cells["zero-shot"]["accuracy"]["n"] == 8 and "refused" not in cells["zero-shot"]
