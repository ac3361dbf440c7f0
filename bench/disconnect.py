"""The engine's work after a client leaves (issue 47): a voting query of T partitions on the
bundled model, its client gone after ``--leave-after`` seconds; the engine process's CPU
seconds from that moment until it is idle again, beside those of a whole answer.

It starts ``dpicl serve`` (the transformers engine in its own process, the bundled
SmolLM2 on the CPU) with the interpreter and ``PYTHONPATH`` it is given, so the same script
measures any version of the server: ``--services /work/main/services`` (before) against this
tree's (after). Only HTTP and ``/proc`` are used.

    PYTHONPATH=services:auditor:. .venv/bin/python bench/disconnect.py [--partitions 40]
        [--leave-after 3] [--services services] [--env DPICL_ENGINE_CHUNK_PROMPTS=0]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ADMIN = "bench-admin"
USER = "bench-user"
TEMPLATE = "Classify the topic of the text.\n\n{exemplars}\n\nText: {query}\nTopic:"
TOPICS = ["World", "Sports", "Business", "Science"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (and its reaped children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _until_idle(pid: int, quiet_s: float = 3.0, cap_s: float = 180.0) -> tuple[float, float]:
    """CPU seconds ``pid`` uses from now until it used under 2% of a core for ``quiet_s``,
    and the wall seconds that took (excluding the quiet tail)."""
    t0, c0 = time.monotonic(), _cpu_s(pid)
    last_busy_t, last_busy_c = t0, c0
    while time.monotonic() - t0 < cap_s:
        time.sleep(0.25)
        c = _cpu_s(pid)
        if c - last_busy_c > 0.02 * 0.25 * 4:  # still computing
            last_busy_t, last_busy_c = time.monotonic(), c
        elif time.monotonic() - last_busy_t >= quiet_s:
            break
    return last_busy_c - c0, last_busy_t - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--partitions", type=int, default=40)
    ap.add_argument("--leave-after", type=float, default=3.0)
    ap.add_argument("--services", default="services", help="the server's code (PYTHONPATH)")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    args = ap.parse_args()

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = Path(tempfile.mkdtemp(prefix="dpicl-disconnect-"))
    env = os.environ | {
        "PYTHONPATH": str(Path(args.services).resolve()),
        "DPICL_ADMIN_TOKEN": ADMIN,
        "DPICL_API_KEYS": USER,
        "DPICL_DATABASE_URL": f"sqlite:///{tmp / 'bench.db'}",
        "DPICL_LOG_LEVEL": "warning",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    env |= dict(kv.split("=", 1) for kv in args.env)
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpicl", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start:\n{(tmp / 'server.log').read_text()}")
            time.sleep(0.5)
        engine_pid = int(httpx.get(f"{url}/readyz").json()["engine_pid"])
        t = args.partitions
        exemplars = [
            {
                "input": f"Report {i}: {TOPICS[i % 4].lower()} news item number {i}",
                "output": TOPICS[i % 4],
            }
            for i in range(2 * t)
        ]
        body = {
            "task": "classification",
            "labels": TOPICS,
            "exemplars": exemplars,
            "template": TEMPLATE,
            "mechanism": {"name": "voting", "epsilon": 1.0, "delta": 1e-5, "partitions": t},
            "budget": {"epsilon": 1000.0, "delta": 1e-3},
        }
        admin = {"Authorization": f"Bearer {ADMIN}"}
        user = {"Authorization": f"Bearer {USER}"}
        r = httpx.post(f"{url}/v1/contexts", json=body, headers=admin, timeout=60)
        r.raise_for_status()
        cid = r.json()["id"]
        ask = {"context_id": cid, "query": "The striker scored twice in the derby"}
        # Warm-up (the prefix cache, the allocator), then one whole answer measured.
        httpx.post(f"{url}/v1/classify", json=ask, headers=user, timeout=600).raise_for_status()
        _until_idle(engine_pid, quiet_s=1.0)
        c0, t0 = _cpu_s(engine_pid), time.monotonic()
        ask["query"] = "Shares fell after the central bank's decision"
        httpx.post(f"{url}/v1/classify", json=ask, headers=user, timeout=600).raise_for_status()
        whole_cpu, whole_wall = _cpu_s(engine_pid) - c0, time.monotonic() - t0
        _until_idle(engine_pid, quiet_s=1.0)
        # The same query with a fresh text, its client gone after --leave-after seconds.
        ask["query"] = "Scientists mapped a distant galaxy with a new telescope"
        before = _cpu_s(engine_pid)
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{url}/v1/classify", json=ask, headers=user, timeout=args.leave_after)
        left_cpu = _cpu_s(engine_pid) - before
        after_cpu, after_wall = _until_idle(engine_pid)
        print(f"server code: {args.services}  env: {args.env or '-'}  T={t}")
        print(f"whole answer: {whole_wall:.1f} s wall, {whole_cpu:.1f} CPU s of the engine")
        print(
            f"client left after {args.leave_after:.1f} s ({left_cpu:.1f} CPU s by then); "
            f"engine afterwards: {after_cpu:.1f} CPU s over {after_wall:.1f} s "
            f"({after_cpu / whole_cpu:.0%} of a whole answer's)"
        )
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


if __name__ == "__main__":
    main()
