"""Three ``dpicl serve`` replicas on one PostgreSQL database behind HAProxy (Debian's package),
routed by the project's own router configuration (deploy/haproxy/haproxy.cfg, its
server-template line replaced by the three test servers), which hashes on the context id
read from the request body.

Through the router: a context's queries reach one replica; the ledger admits exactly the
budget under 4x overload; killing (SIGKILL) the replica that serves a context under load
loses no charged answer (every charge in the database is an answer the client received, or
belongs to a request that failed when its replica died: counted as spent, docs/privacy.md)
and moves that context to another replica; and a small black-box audit runs to completion.
"""

from __future__ import annotations

import asyncio
import csv
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from dpicl.privacy.accounting import gaussian_mu2
from dpicl.privacy.calibration import gaussian_epsilon
from dpicl_audit.pipeline.run import run_audit
from tests.conftest import admin_headers, free_port, user_headers
from tests.server.api_helpers import voting_context
from tests.servers import ROOT, target_plan

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HAPROXY = shutil.which("haproxy") or (
    "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
)
ROUTER_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
REPLICAS = 3


def router_config(servers: list[str], stats_socket: Path) -> str:
    """The deployed router configuration with the test's servers in place of DNS discovery,
    and a stats socket through which the test waits for every replica's health checks."""
    text = ROUTER_CFG.read_text()
    template = re.search(r"^\s*server-template .*$", text, re.MULTILINE)
    assert template, "deploy/haproxy/haproxy.cfg has no server-template line"
    lines = "\n".join(
        f"    server r{i} {url.removeprefix('http://')} check" for i, url in enumerate(servers)
    )
    text = text.replace(template.group(0), lines)
    return text.replace("global\n", f"global\n    stats socket {stats_socket} mode 600\n", 1)


def servers_up(stats_socket: Path) -> set[str]:
    """The backend's servers HAProxy's health checks have marked UP (``show stat``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        sock.connect(str(stats_socket))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    rows = csv.reader(data.decode().lstrip("# ").splitlines())
    header = next(rows)
    name, status = header.index("svname"), header.index("status")
    return {r[name] for r in rows if len(r) > status and r[status] == "UP"}


@pytest.fixture
def router(pg_url: str, start_server: Any, tmp_path: Path) -> Iterator[tuple[str, list[Any]]]:
    if HAPROXY is None:
        pytest.skip("haproxy is not installed (Debian: apt-get install haproxy; .ci/run does)")
    env = {"DPICL_ENGINE": "oracle", "DPICL_DATABASE_URL": pg_url, "DPICL_METRICS": "open"}
    servers = [start_server(env, wait=False) for _ in range(REPLICAS)]
    for srv in servers:
        srv.wait_ready()
    cfg = tmp_path / "haproxy.cfg"
    stats = tmp_path / "haproxy.sock"
    cfg.write_text(router_config([s.url for s in servers], stats))
    port = free_port()
    log = (tmp_path / "haproxy.log").open("w")
    proc = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(cfg)],
        env=os.environ | {"ROUTER_PORT": str(port), "ROUTER_SERVERS": "unused:1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "haproxy.log").read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the router never became ready"
            time.sleep(0.2)
        # The router answers as soon as ONE replica passes its checks (rise 2, inter 1s);
        # until all three have, every context hashes to the first one up.
        wanted = {f"r{i}" for i in range(REPLICAS)}
        while not wanted <= (up := servers_up(stats)):
            assert time.monotonic() < deadline, f"replicas never all UP in the router: {up}"
            time.sleep(0.2)
        yield url, servers
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def charges(pg_url: str) -> dict[str, int]:
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, queries FROM dpicl_contexts")).all()
    engine.dispose()
    return {r[0]: int(r[1]) for r in rows}


def test_three_replicas_behind_haproxy(
    router: tuple[str, list[Any]], pg_url: str, tmp_path: Path
) -> None:
    url, servers = router
    by_name = {f"r{i}": s for i, s in enumerate(servers)}
    figures: dict[str, object] = {}

    with httpx.Client(base_url=url, timeout=30) as h:
        # Affinity: each context's queries all reach one replica (the router says which).
        contexts = [
            h.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
            for _ in range(6)
        ]
        home: dict[str, str] = {}
        for cid in contexts:
            served = {
                h.post(
                    "/v1/classify",
                    json={"context_id": cid, "query": f"q{i}"},
                    headers=user_headers(),
                ).headers["x-dpicl-replica"]
                for i in range(4)
            }
            assert len(served) == 1, (cid, served)
            home[cid] = served.pop()
        figures["replicas_used_by_6_contexts"] = len(set(home.values()))
        assert len(set(home.values())) >= 2  # 6 contexts over 3 replicas: p(all on one) = 1/243

    # The ledger under 4x overload through the router: exactly the budget.
    eps, delta, k = 1.0, 1e-5, 12
    sigma = 2 * math.sqrt(math.log(1.25 / delta)) / eps
    budget_eps = gaussian_epsilon(delta, math.sqrt(k * gaussian_mu2(sigma, math.sqrt(2))))
    body = voting_context(budget={"epsilon": budget_eps, "delta": delta})
    budgeted = httpx.post(f"{url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    bid = budgeted.json()["id"]

    async def overload() -> Counter[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:

            async def one(i: int) -> int:
                q = {"context_id": bid, "query": f"over {i}"}
                return (
                    await client.post("/v1/classify", json=q, headers=user_headers())
                ).status_code

            return Counter(await asyncio.gather(*(one(i) for i in range(4 * k))))

    t0 = time.monotonic()
    counts = asyncio.run(overload())
    figures["overload_s"] = round(time.monotonic() - t0, 2)
    assert counts == Counter({200: k, 402: 3 * k}), counts
    assert charges(pg_url)[bid] == k

    # Kill the replica of one context mid-load; every context keeps being queried.
    victim_ctx = contexts[0]
    victim = home[victim_ctx]
    answered: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    served_after: dict[str, set[str]] = defaultdict(set)
    before = charges(pg_url)
    killed_at: list[float] = []

    async def load() -> None:
        stop = time.monotonic() + 4.0
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def worker(cid: str) -> None:
                i = 0
                while time.monotonic() < stop:
                    i += 1
                    q = {"context_id": cid, "query": f"load {i}"}
                    try:
                        r = await client.post("/v1/classify", json=q, headers=user_headers())
                    except httpx.HTTPError:
                        failed[cid] += 1
                        continue
                    if r.status_code == 200:
                        answered[cid] += 1
                        if killed_at and time.monotonic() > killed_at[0] + 2.5:
                            served_after[cid].add(r.headers["x-dpicl-replica"])
                    else:
                        assert r.status_code in (502, 503), r.text
                        failed[cid] += 1

            async def kill() -> None:
                await asyncio.sleep(1.0)
                by_name[victim].proc.send_signal(signal.SIGKILL)
                killed_at.append(time.monotonic())

            await asyncio.gather(kill(), *(worker(c) for c in contexts for _ in range(2)))

    asyncio.run(load())
    after = charges(pg_url)
    for cid in contexts:
        charged = after[cid] - before[cid]
        # No charged answer lost: each charge was received, or its request failed with the
        # replica (then it counts as spent, never refunded: docs/privacy.md).
        assert answered[cid] <= charged <= answered[cid] + failed[cid], (
            cid,
            answered[cid],
            charged,
            failed[cid],
        )
    # The victim's context moved to a live replica; the others kept theirs.
    assert served_after[victim_ctx] and victim not in served_after[victim_ctx]
    for cid in contexts[1:]:
        if home[cid] != victim:
            assert served_after[cid] == {home[cid]}, (cid, served_after[cid], home[cid])
    figures["answers_during_kill_load"] = sum(answered.values())
    figures["failed_at_kill"] = sum(failed.values())
    figures["charged_without_answer"] = sum(after[c] - before[c] - answered[c] for c in contexts)

    # A black-box audit over HTTP through the router, with a replica down.
    plan = target_plan(
        url, **{"threat_model": "black-box", "trials": 40, "mechanism.epsilons": [8.0]}
    )
    t0 = time.monotonic()
    results = asyncio.run(
        run_audit(plan, db=tmp_path / "audit.db", out_dir=tmp_path / "runs", progress=False)
    )
    figures["audit_s"] = round(time.monotonic() - t0, 2)
    assert [s["trials"] for s in results["settings"]] == [40]
    print("FIGURES", figures)
