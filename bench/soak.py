"""Soak (issue 47; not CI): a real ``dpicl serve`` under steady mixed load for
``--duration`` seconds; the resident memory (RSS) of its server and engine processes
sampled every ``--sample-s`` seconds against the HTTP requests answered, and its growth
after warm-up reported per 10,000 requests. The bar: at most 2 MB per 10,000 requests.

The figure. Warm-up is the first ``--warmup`` requests or the first ``--warmup-fraction``
of the run's requests, whichever is more: memory taken once and then reused (pymalloc's
and glibc's arenas touched page by page, SQLAlchemy's statement cache, SQLite's page
caches, bounded memos) fills over the first minutes, and its filling is not growth. After
it, the growth is the least-squares slope of RSS against requests answered, with a
standard error that allows for the samples' autocorrelation (bench/soak_fit.py), for the
server, the engine (in a process of its own: ``--engine-process on``, the default), the
supervisor's standby engine and all together. The verdict is on all together: PASS when
the 95% interval lies at or under the bar, FAIL when wholly above it, INCONCLUSIVE
otherwise. Also reported: requests, their rate, answers by status, transport errors, the
database's size and the engine's restarts. ``--out`` writes it all (with every sample) as
JSON.

The load: native and OpenAI-compatible classification, streamed and not, on a context
replaced (created anew, the old one deleted) whenever its budget is spent; listings with
cursors; key creation, use and revocation; refusals (404 of a missing context and of
paths never seen, 422, 402 of an exhausted budget, 429 of a rate limit); readiness with
request ids never seen; metrics. The oracle simulator by default (about a hundred
requests a second on two shared cores); ``--engine transformers`` for the bundled model.

``--trace`` finds what grows: tracemalloc in both processes (bench/memtrace.py), started
at a quarter of the run, snapshots at half and at the end, and the growth between them
by allocating line and by object type. It slows the server and adds its own memory, so a
traced run gets no verdict.

    PYTHONPATH=services:auditor:. .venv/bin/python bench/soak.py --duration 3600 \\
        --out soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from bench.soak_fit import fit_growth, verdict

ADMIN = "soak-admin"
USER = "soak-user"
BENCH = Path(__file__).resolve().parent
#: Statuses the load asks for; any other is an error of the soak's figure.
EXPECTED = {200, 201, 204, 402, 404, 422, 429}
#: Snapshot points of ``--trace`` (fractions of the duration).
TRACE_AT = (0.25, 0.5, 1.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:  # the engine process was restarted: its old pid is gone
        return float("nan")
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the engine and the supervisor's standby engine)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for kid in map(int, kids):
            out += [kid, *_descendants(kid)]
    return out


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


@dataclass
class Contexts:
    """The context answered (replaced by a new one of the same ``budget`` when it is
    spent) and the one whose budget is always spent (402)."""

    cid: str
    poor: str
    budget: float
    replaced: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def replace(self, c: httpx.AsyncClient, spent: str) -> None:
        async with self.lock:
            if self.cid != spent:
                return  # another worker replaced it first
            admin = {"Authorization": f"Bearer {ADMIN}"}
            r = await c.post("/v1/contexts", json=_context("soak", self.budget), headers=admin)
            self.cid = r.json()["id"]
            self.replaced += 1
            await c.delete(f"/v1/contexts/{spent}", headers=admin)


async def _one(c: httpx.AsyncClient, rng: random.Random, ctx: Contexts) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    user = {"Authorization": f"Bearer {USER}"}
    q = f"Record {rng.randrange(10_000)}: invoice paid"
    cid, poor = ctx.cid, ctx.poor
    kind = rng.random()
    if kind < 0.35:
        r = await c.post("/v1/classify", json={"context_id": cid, "query": q}, headers=user)
        if r.status_code == 402:
            await ctx.replace(c, cid)
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
        await c.get(f"/v1/no-such-route/{rng.randrange(10**9)}")  # 404, a path never seen
    else:
        # A request id never seen: neither it nor the path above may become a label.
        await c.get("/readyz", headers={"X-Request-ID": f"soak-{rng.randrange(10**12)}"})
        await c.get("/metrics", headers=admin)


@dataclass
class Sample:
    """One reading: seconds since the load began, requests answered, RSS (MB) of the server,
    of the engine process that serves and of the server's other child processes (the
    supervisor's standby engine), the database's bytes on disk (file and write-ahead log)."""

    t: float
    requests: int
    server_mb: float
    engine_mb: float
    others_mb: float
    db_bytes: int


@dataclass
class Load:
    """What the load saw: answers by status, transport errors by type, operations run,
    contexts replaced."""

    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    operations: int = 0
    contexts_replaced: int = 0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    async def on_response(self, response: httpx.Response) -> None:
        self.statuses[response.status_code] += 1


def _db_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())


async def _engine_pid(url: str) -> int | None:
    async with httpx.AsyncClient(timeout=10) as c:
        pid = (await c.get(f"{url}/readyz")).json().get("engine_pid")
    return int(pid) if pid else None


async def _run_load(
    url: str, args: argparse.Namespace, server_pid: int, db: Path, trace: Path | None
) -> tuple[Load, list[Sample], list[int]]:
    rng = random.Random(47)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    load = Load()
    samples: list[Sample] = []
    engine_pids: list[int] = []
    hooks = {"response": [load.on_response]}
    async with httpx.AsyncClient(base_url=url, timeout=60, event_hooks=hooks) as c:
        cid = (
            await c.post("/v1/contexts", json=_context("soak", args.budget), headers=admin)
        ).json()
        poor = (await c.post("/v1/contexts", json=_context("soak", 0.01), headers=admin)).json()
        ctx = Contexts(cid["id"], poor["id"], args.budget)
        for _ in range(3):
            await c.post("/v1/contexts", json=_context("other", 1.0), headers=admin)
        t0 = time.monotonic()
        t_end = t0 + args.duration

        async def worker() -> None:
            while time.monotonic() < t_end:
                try:
                    await _one(c, rng, ctx)
                except (httpx.HTTPError, ValueError, KeyError) as exc:  # counted, not fatal
                    load.errors[type(exc).__name__] += 1
                load.operations += 1

        tasks = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
        traces = list(TRACE_AT) if trace else []
        while time.monotonic() < t_end:
            await asyncio.sleep(min(args.sample_s, max(t_end - time.monotonic(), 0)))
            pid = await _engine_pid(url)
            if pid is not None and (not engine_pids or engine_pids[-1] != pid):
                engine_pids.append(pid)
            s = Sample(
                t=time.monotonic() - t0,
                requests=load.requests,
                server_mb=_rss_mb(server_pid),
                engine_mb=_rss_mb(pid) if pid is not None else 0.0,
                others_mb=sum(_rss_mb(p) for p in _descendants(server_pid) if p != pid),
                db_bytes=_db_bytes(db),
            )
            samples.append(s)
            print(
                f"{s.t:7.0f} s {s.requests:>9} requests  RSS server {s.server_mb:7.1f} MB  "
                f"engine {s.engine_mb:7.1f} MB  standby {s.others_mb:7.1f} MB  "
                f"database {s.db_bytes / 2**20:6.1f} MB",
                flush=True,
            )
            if traces and s.t >= traces[0] * args.duration - args.sample_s / 2:
                traces.pop(0)
                for p in {server_pid, *engine_pids[-1:]}:
                    os.kill(p, signal.SIGUSR1)
        await asyncio.gather(*tasks)
    load.contexts_replaced = ctx.replaced
    return load, samples, engine_pids


def _mb(s: Sample, what: str) -> float:
    """RSS of ``what``: "server", "engine", "standby" or "total" (all three)."""
    parts = {"server": s.server_mb, "engine": s.engine_mb, "standby": s.others_mb}
    return parts.get(what, sum(parts.values()))


def summarise(
    load: Load, samples: list[Sample], engine_pids: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    """The soak's result: figures, verdict and every sample (the JSON of ``--out``)."""
    total = load.requests
    warmup = max(args.warmup, int(args.warmup_fraction * total))
    after = [s for s in samples if s.requests >= warmup]
    result: dict[str, Any] = {
        "duration_s": args.duration,
        "engine": args.engine,
        "engine_process_setting": args.engine_process,
        "concurrency": args.concurrency,
        "budget": args.budget,
        "requests": total,
        "operations": load.operations,
        "requests_per_s": total / args.duration,
        "statuses": {str(k): v for k, v in sorted(load.statuses.items())},
        "unexpected_statuses": {
            str(k): v for k, v in sorted(load.statuses.items()) if k not in EXPECTED
        },
        "transport_errors": dict(load.errors),
        "contexts_replaced": load.contexts_replaced,
        "engine_process": bool(engine_pids),
        "engine_restarts": max(len(engine_pids) - 1, 0),
        "warmup_rule": f"max({args.warmup} requests, {args.warmup_fraction:g} of the run)",
        "warmup_requests": warmup,
        "bar_mb_per_10k": args.bar,
        "traced": args.trace,
        "samples": [asdict(s) for s in samples],
    }
    if len(after) < 3 or engine_pids[1:]:
        why = "an engine restart" if engine_pids[1:] else "fewer than 3 samples after warm-up"
        result["verdict"] = f"INCONCLUSIVE ({why}: run longer)"
        return result
    parts = ("server", "engine", "standby", "total") if engine_pids else ("server",)
    fits = {
        what: fit_growth([s.requests for s in after], [_mb(s, what) for s in after])
        for what in parts
    }
    for what, g in fits.items():
        result[f"{what}_growth"] = asdict(g) | {"interval95": g.interval()}
        result[f"{what}_mb"] = [_mb(after[0], what), _mb(after[-1], what)]
    result["verdict"] = (
        "NOT JUDGED (traced run: tracemalloc's own memory)"
        if args.trace
        else verdict(fits[parts[-1]], args.bar)
    )
    return result


def _report(result: dict[str, Any]) -> None:
    print(
        f"{result['requests']} requests ({result['operations']} operations) in "
        f"{result['duration_s']:.0f} s, {result['requests_per_s']:.1f}/s; by status "
        f"{result['statuses']}; unexpected statuses {result['unexpected_statuses'] or 'none'}; "
        f"transport errors {result['transport_errors'] or 'none'}; engine restarts "
        f"{result['engine_restarts']}; contexts spent and replaced {result['contexts_replaced']}"
    )
    print(f"warm-up: {result['warmup_rule']} = {result['warmup_requests']} requests")
    if not result["engine_process"]:
        print("the engine runs inside the server process: one RSS, the server's")
    for what in ("server", "engine", "standby", "total"):
        if f"{what}_growth" not in result:
            continue
        g, mb = result[f"{what}_growth"], result[f"{what}_mb"]
        low, high = g["interval95"]
        print(
            f"[{what:7}] RSS {mb[0]:.1f} -> {mb[1]:.1f} MB over {g['requests']} requests "
            f"after warm-up; growth {g['slope']:+.2f} +- {g['se']:.2f} MB per 10,000 requests "
            f"(autocorrelation-adjusted s.e.; 95% {low:+.2f} .. {high:+.2f}; {g['n']} samples)"
        )
    print(f"verdict against {result['bar_mb_per_10k']} MB per 10,000 requests: {result['verdict']}")


def _trace_report(trace: Path, pids: list[int]) -> None:
    from bench.memtrace import compare

    for pid in pids:
        snaps = sorted(trace.glob(f"{pid}-*.snap"), key=lambda p: int(p.stem.split("-")[1]))
        for before, after in itertools.pairwise(snaps):
            print(f"--- process {pid}: {before.name} -> {after.name}")
            print("\n".join(compare(before, after)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of load")
    ap.add_argument(
        "--warmup", type=int, default=5000, help="at least this many requests are warm-up"
    )
    ap.add_argument(
        "--warmup-fraction",
        type=float,
        default=0.25,
        help="share of the run's requests that is warm-up (the larger of the two rules wins)",
    )
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--budget",
        type=float,
        default=100.0,
        help="epsilon budget of the context answered: spent in a few minutes, so contexts "
        "are created and deleted all through a run (their caches and metric series go too)",
    )
    ap.add_argument("--engine", default="oracle")
    ap.add_argument(
        "--engine-process",
        choices=("auto", "on", "off"),
        default="on",
        help="DPICL_ENGINE_PROCESS (on: the engine's RSS apart from the server's; auto: "
        "in the server process for the oracle)",
    )
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--bar", type=float, default=2.0, help="MB per 10,000 requests")
    ap.add_argument("--out", type=Path, help="write the result (and every sample) as JSON")
    ap.add_argument("--trace", action="store_true", help="tracemalloc: what grows (no verdict)")
    args = ap.parse_args()
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="dpicl-soak-"))
    db = tmp / "soak.db"
    env = os.environ | {
        "DPICL_ENGINE": args.engine,
        "DPICL_ENGINE_PROCESS": args.engine_process,
        "DPICL_ADMIN_TOKEN": ADMIN,
        "DPICL_API_KEYS": USER,
        "DPICL_DATABASE_URL": f"sqlite:///{db}",
        "DPICL_LOG_LEVEL": "warning",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    trace = tmp / "trace" if args.trace else None
    if trace is not None:
        # Both processes import this at start (Python's site hook); the server knows nothing.
        site = tmp / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            f"import sys\nsys.path.insert(0, {str(BENCH)!r})\nimport memtrace\nmemtrace.install()\n"
        )
        trace.mkdir()
        env |= {
            "DPICL_SOAK_TRACE_DIR": str(trace),
            "PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")]),
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
        load, samples, engine_pids = asyncio.run(_run_load(url, args, proc.pid, db, trace))
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    result = summarise(load, samples, engine_pids, args)
    _report(result)
    print(f"server log: {tmp / 'server.log'}")
    if trace is not None:
        _trace_report(trace, [proc.pid, *engine_pids])
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
        print(f"written: {args.out}")


if __name__ == "__main__":
    main()
