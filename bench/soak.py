"""Soak (issue 47; not CI): a real ``dpicl serve`` under steady mixed load for
``--duration`` seconds; its resident memory (RSS, server and engine processes) sampled
against the requests answered, and its growth after warm-up reported per 10,000 requests
(least squares over every sample after ``--warmup`` requests). The bar: at most 2 MB per
10,000 requests.

The load: native and OpenAI-compatible classification, streamed and not; listings with
cursors; key creation, use and revocation; refusals (404, 422, 402 of an exhausted
budget, 429 of a rate limit). The oracle simulator by default (thousands of requests a
minute); ``--engine transformers`` for the bundled model.

    PYTHONPATH=services:auditor:. .venv/bin/python bench/soak.py --duration 3600
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ADMIN = "soak-admin"
USER = "soak-user"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _context(tenant: str, budget: float) -> dict[str, object]:
    return {
        "task": "classification",
        "labels": ["Yes", "No"],
        "exemplars": [
            {"input": f"Record {i}: invoice {1000 + i} paid", "output": ["Yes", "No"][i % 2]}
            for i in range(8)
        ],
        "template": "Context:\n{exemplars}\n\nQuery: {query}\nAnswer:",
        "mechanism": {"name": "voting", "epsilon": 1.0, "delta": 1e-5, "partitions": 4},
        "budget": {"epsilon": budget, "delta": 1e-3},
        "tenant": tenant,
    }


async def _one(c: httpx.AsyncClient, rng: random.Random, state: dict[str, object]) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    user = {"Authorization": f"Bearer {USER}"}
    cid, poor = str(state["cid"]), str(state["poor"])
    q = f"Record {rng.randrange(10_000)}: invoice paid"
    kind = rng.random()
    if kind < 0.35:
        await c.post("/v1/classify", json={"context_id": cid, "query": q}, headers=user)
    elif kind < 0.5:
        body = {"model": cid, "messages": [{"role": "user", "content": q}]}
        await c.post("/v1/chat/completions", json=body, headers=user)
    elif kind < 0.55:
        body = {"model": cid, "messages": [{"role": "user", "content": q}], "stream": True}
        async with c.stream("POST", "/v1/chat/completions", json=body, headers=user) as r:
            async for _ in r.aiter_bytes():
                pass
    elif kind < 0.65:
        r = await c.get("/v1/contexts", params={"limit": 2}, headers=admin)
        nxt = r.json().get("next")
        if nxt:
            await c.get("/v1/contexts", params={"limit": 2, "cursor": nxt}, headers=admin)
    elif kind < 0.72:
        r = await c.post("/v1/keys", json={"tenant": "soak", "rate_limit": 2}, headers=admin)
        key = r.json()
        kh = {"Authorization": f"Bearer {key['secret']}"}
        for _ in range(3):  # the third is a 429
            await c.post("/v1/classify", json={"context_id": cid, "query": q}, headers=kh)
        await c.delete(f"/v1/keys/{key['id']}", headers=admin)
    elif kind < 0.8:
        await c.post("/v1/classify", json={"context_id": poor, "query": q}, headers=user)  # 402
    elif kind < 0.9:
        await c.get(f"/v1/contexts/ctx_{rng.randrange(16**24):024x}", headers=admin)  # 404
        await c.get("/v1/keys", params={"after": "key_\x00"}, headers=admin)  # 422
    else:
        await c.get("/readyz")
        await c.get("/metrics", headers=admin)


async def _load(url: str, args: argparse.Namespace, pids: list[int]) -> None:
    rng = random.Random(47)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        r = await c.post("/v1/contexts", json=_context("soak", 1000.0), headers=admin)
        cid = r.json()["id"]
        r = await c.post("/v1/contexts", json=_context("soak", 0.01), headers=admin)
        poor = r.json()["id"]
        for _ in range(3):
            await c.post("/v1/contexts", json=_context("other", 1.0), headers=admin)
        state: dict[str, object] = {"cid": cid, "poor": poor}
        done = 0
        samples: list[tuple[int, float]] = []
        t_end = time.monotonic() + args.duration
        next_sample = 0

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < t_end:
                await _one(c, rng, state)
                done += 1

        tasks = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
        while time.monotonic() < t_end:
            await asyncio.sleep(5)
            if done >= next_sample:
                rss = sum(_rss_mb(p) for p in pids)
                samples.append((done, rss))
                print(f"{done:>9} requests  RSS {rss:8.1f} MB", flush=True)
                next_sample = done + 1
        await asyncio.gather(*tasks)
    after = [(n, m) for n, m in samples if n >= args.warmup]
    if len(after) < 3:
        print("too few samples after warm-up: run longer")
        return
    n_mean = sum(n for n, _ in after) / len(after)
    m_mean = sum(m for _, m in after) / len(after)
    slope = sum((n - n_mean) * (m - m_mean) for n, m in after) / sum(
        (n - n_mean) ** 2 for n, _ in after
    )
    print(
        f"{done} requests in {args.duration:.0f} s; RSS after warm-up ({args.warmup} requests): "
        f"{after[0][1]:.1f} -> {after[-1][1]:.1f} MB; growth {slope * 10_000:.2f} MB per "
        "10,000 requests (least squares; bar: 2 MB)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--warmup", type=int, default=5000, help="requests before RSS counts")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--engine", default="oracle")
    args = ap.parse_args()
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="dpicl-soak-"))
    env = os.environ | {
        "DPICL_ENGINE": args.engine,
        "DPICL_ADMIN_TOKEN": ADMIN,
        "DPICL_API_KEYS": USER,
        "DPICL_DATABASE_URL": f"sqlite:///{tmp / 'soak.db'}",
        "DPICL_LOG_LEVEL": "warning",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpicl", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        ready = httpx.get(f"{url}/readyz").json()
        pids = sorted({proc.pid, int(ready.get("engine_pid") or proc.pid)})
        asyncio.run(_load(url, args, pids))
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


if __name__ == "__main__":
    main()
