"""Abandoned non-streamed answers stop (issue 39): a long DPS-MOZO answer asked on the native
route and on the OpenAI-compatible route without streaming, whose client leaves after a
fraction of a second, stops sampling within a step or two (the test engine logs each step;
``tests.e2e.slow_decoding_server``), the server process stops using the CPU, and the answer
stays charged (docs/privacy.md: a cancelled answer keeps its charge). A real ``dpicl serve``
process, real sockets."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN
from tests.e2e.test_openai_sdk import create, ledger, mozo_body
from tests.servers import oracle_server_env

#: The server's CPU (user + system) allowed over IDLE_S once the answer stopped: its idle
#: loop, a health probe, the log. A DPS-MOZO answer going on costs far more (every step).
IDLE_S = 1.0
IDLE_CPU_S = 0.15


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _leave(url: str, body: dict[str, Any]) -> None:
    """Ask, then go away before the answer (a client timeout closes the connection)."""
    try:
        httpx.post(url, json=body, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=0.6)
    except httpx.TimeoutException:
        return
    raise AssertionError("the answer came before the client left: make it longer")


@pytest.mark.slow
def test_an_abandoned_answer_stops_and_keeps_its_charge(start_server: Any, tmp_path: Path) -> None:
    steps = tmp_path / "steps.log"
    env = oracle_server_env(tmp_path, whitebox="off") | {"DPICL_TEST_STEP_LOG": str(steps)}
    srv = start_server(env, fault="tests.e2e.slow_decoding_server")
    cid = create(srv, mozo_body(max_tokens=60, queries=3))
    query = "Summarise topic 2."
    asks = [
        (f"{srv.url}/v1/generate", {"context_id": cid, "query": query, "max_tokens": 60}),
        (
            f"{srv.url}/v1/chat/completions",
            {"model": cid, "messages": [{"role": "user", "content": query}], "max_tokens": 60},
        ),
    ]
    for n, (url, body) in enumerate(asks, start=1):
        steps.write_text("")
        _leave(url, body)
        at_leave = len(steps.read_text().splitlines())
        cpu = _cpu_s(srv.proc.pid)
        time.sleep(IDLE_S)  # ten steps' time (0.1 s a step)
        after = len(steps.read_text().splitlines())
        used = _cpu_s(srv.proc.pid) - cpu
        # 60 steps (6 s) if it went on; it stopped within a step or two of the client.
        assert after <= at_leave + 2, (url, at_leave, after)
        assert after < 20, (url, after)
        assert used < IDLE_CPU_S, (url, used)
        # Charged whole before its first token; the cancellation keeps the charge.
        assert ledger(srv, cid)["queries"] == n, url
    # The server answers the next query as usual.
    r = httpx.post(
        f"{srv.url}/v1/generate",
        json={"context_id": cid, "query": "hi", "max_tokens": 2},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    assert r.status_code == 200 and ledger(srv, cid)["queries"] == 3
