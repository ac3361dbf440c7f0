"""Several server processes on one port, ``DPICL_WORKERS`` (issue 30; api/workers.py): real
``dpicl serve`` supervisors, each with two worker processes. Both workers answer; an admin
token generated at start is one token for both; ``/metrics`` counts every worker's answers;
the one ledger admits exactly a budget's answers under overload across the workers (SQLite
and PostgreSQL); stopping the supervisor stops every worker. And the parts: each worker's
share of the cores, and vLLM refused with workers, naming the setting."""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from dpicl.api.workers import worker_environment
from dpicl.cli import app as cli_app
from dpicl.config import Settings
from dpicl.engines.threads import choose_threads
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import voting_context
from tests.server.test_keys_processes import budget_for, fire, spend_adds_up

WORKERS = 2


def test_each_worker_takes_its_share_of_the_cores() -> None:
    plan = choose_threads(None, None, cores=8, workers=2)
    assert (plan.intra, plan.interop) == (4, 2)
    assert plan.source == "usable cores (8) shared by 2 workers"
    assert choose_threads(None, None, cores=2, workers=4).intra == 1  # never below one
    assert choose_threads(None, None, cores=3, workers=1).source == "usable cores (3)"
    assert choose_threads(3, None, cores=8, workers=2).intra == 3  # DPICL_TORCH_THREADS wins
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        choose_threads(None, None, cores=2, workers=0)


def test_vllm_with_workers_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="2 workers with DPICL_ENGINE=vllm"):
        Settings(engine="vllm", workers=2)
    assert Settings(engine="vllm", workers=1).workers == 1
    assert Settings(engine="oracle", workers=4).workers == 4
    monkeypatch.setenv("DPICL_ENGINE", "vllm")
    monkeypatch.setenv("DPICL_WORKERS", "2")
    out = CliRunner().invoke(cli_app, ["serve"])
    assert out.exit_code == 2
    assert "DPICL_WORKERS" in out.output and "DPICL_VLLM_DATA_PARALLEL_SIZE" in out.output


def test_worker_environment_carries_the_token_and_the_metrics_folder() -> None:
    s, generated = Settings(admin_token=None, workers=3).with_generated_secrets()
    assert generated and s.admin_token is not None
    env = worker_environment(s, "/tmp/m")
    assert env == {
        "DPICL_WORKERS": "3",  # also when it came from `dpicl serve --workers 3`
        "DPICL_ADMIN_TOKEN": s.admin_token.get_secret_value(),
        "PROMETHEUS_MULTIPROC_DIR": "/tmp/m",
    }
    assert "PROMETHEUS_MULTIPROC_DIR" not in worker_environment(s, None)


def _workers_of(pid: int) -> set[int]:
    """The worker processes of the supervisor ``pid``: its children started by
    multiprocessing's spawn (not its resource tracker)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            argv = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in argv:
            out.add(int(stat.parent.name))
    return out


def _pids_answering(url: str, headers: dict[str, str], tries: int = 400) -> set[int]:
    """The worker pids ``/readyz`` names over fresh connections, until both are seen."""
    seen: set[int] = set()
    for _ in range(tries):
        r = httpx.get(f"{url}/readyz", headers=headers, timeout=30)  # a new connection each
        assert r.status_code == 200, r.text
        assert r.json()["workers"] == WORKERS
        seen.add(r.json()["pid"])
        if len(seen) == WORKERS:
            break
    return seen


def _overload(url: str, headers: dict[str, str], k: int) -> str:
    """A context budgeted for exactly k answers, asked 4k times at once; its id."""
    r = httpx.post(
        f"{url}/v1/contexts",
        json=voting_context(budget=budget_for(k)),
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 201, r.text
    cid = str(r.json()["id"])
    counts = fire([url], cid, user_headers(), 4 * k)
    assert counts == Counter({200: k, 402: 3 * k}), counts
    return cid


@pytest.mark.slow
def test_two_workers_one_port_one_token_one_ledger_and_metrics(
    tmp_path: Path, start_server: Any
) -> None:
    db = f"sqlite:///{tmp_path}/w.db"
    srv = start_server(
        {
            "DPICL_ENGINE": "oracle",
            "DPICL_DATABASE_URL": db,
            "DPICL_WORKERS": str(WORKERS),
            "DPICL_ADMIN_TOKEN": "",  # none configured: generated once, by the supervisor
            "DPICL_LOG_LEVEL": "info",
        }
    )
    log = srv.log_path.read_text()
    tokens = re.findall(r"generated admin token: (\S+)", log)
    assert len(tokens) == 1, log
    admin = {"Authorization": f"Bearer {tokens[0]}"}
    workers = _workers_of(srv.proc.pid)
    assert len(workers) == WORKERS, (workers, log)
    # Both workers answer on the one port, and both accept the one generated token.
    assert _pids_answering(srv.url, admin) == workers
    k = 5
    cid = _overload(srv.url, admin, k)
    info = httpx.get(f"{srv.url}/v1/contexts/{cid}", headers=admin, timeout=30).json()
    assert info["spent"]["queries"] == k
    spend_adds_up(db)
    # The metrics of both workers, whichever answers the scrape: every classify counted.
    for _ in range(4):
        text = httpx.get(f"{srv.url}/metrics", headers=admin, timeout=30).text
        answered = {
            status: float(n)
            for status, n in re.findall(
                r'dpicl_http_requests_total\{method="POST",route="/v1/classify",'
                r'status="(\d+)"\} (\S+)',
                text,
            )
        }
        assert answered == {"200": k, "402": 3 * k}, answered
    srv.stop()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in workers):
        time.sleep(0.1)
    assert not [p for p in workers if os.path.exists(f"/proc/{p}")], "a worker outlived it"


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_never_overspend_on_postgres(pg_url: str, start_server: Any) -> None:
    # The flag, not the variable: each worker still learns their number (/readyz says 2).
    serve = [sys.executable, "-m", "dpicl", "serve", "--port", "{port}", "--workers", "2"]
    srv = start_server({"DPICL_ENGINE": "oracle", "DPICL_DATABASE_URL": pg_url}, command=serve)
    admin = admin_headers()
    assert len(_pids_answering(srv.url, admin)) == WORKERS
    for k in (3, 8):
        _overload(srv.url, admin, k)
    spend_adds_up(pg_url)
