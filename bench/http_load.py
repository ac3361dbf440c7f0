"""Request-path benchmark (issue 13, item 2): oracle-engine requests per second and server
CPU per request, the code before the lean path against this checkout, side by side in one
run; and SQLite's p99 latency with this process's charges serialised against without.

What it compares (A/B of real server processes on the oracle simulator, each with its
own fresh SQLite file, loaded in turn by the same client):

* ``before``: the server at ``--baseline`` (a git revision, extracted with ``git archive``;
  default: the commit before the lean path), run by plain uvicorn (asyncio loop, h11), as
  it was installed before ``uvicorn[standard]``;
* ``lean``: this checkout, uvicorn with uvloop and httptools (``uvicorn[standard]``) and
  the options ``dpicl serve`` passes (``dpicl.api.http_limits``: head limits, a
  connection limit);
* ``lean, unserialised``: this checkout with ``DPICL_DB_SERIALIZE_SQLITE_WRITES=false``,
  for the p99 comparison only;
* ``lean, no head limits``: this checkout on uvicorn's own httptools protocol, for the
  cost of the head limits (CPU per request, served options against none).

Rounds are interleaved (before, lean, unserialised, before, ...) and medians reported, so a
noisy shared machine loads every variant alike. The client is a minimal keep-alive
HTTP/1.1 client over asyncio streams (much cheaper than httpx), so the servers, not the
client, are what is measured. CPU per request is the server process's user+system time
(from /proc) over the round, divided by the requests it answered. A 503
``storage_unavailable`` (a charge that waited out SQLite's busy timeout) is counted and
reported, not hidden: it is what unserialised charges do under load.

    .venv/bin/python bench/http_load.py [--quick] [--baseline REV] [--concurrency 16]

``--ledger`` measures the ledger under concurrency instead (issue 30, item 3): requests/s at
concurrency 16 against 1 on the oracle engine, on SQLite and on PostgreSQL, with one
transaction per charge (``single``: ``DPICL_LEDGER_GROUP_COMMIT_MS=0``, the charge path
before group commit) against group commit (``group``: the default window), all servers of
this checkout, interleaved rounds, the load average printed beside them:

    .venv/bin/python bench/http_load.py --ledger [--requests 600] [--rounds 3] [--pg-url URL]

and ``workers``: group commit in ``--workers`` server processes on one port (``DPICL_WORKERS``;
default: this machine's cores), since one Python process answers on one core at a time. CPU
per request counts the server's whole process tree.

``--before REV`` adds the server of git revision REV (group commit) to every database, for a
change's before and after in one run; ``--paths group`` leaves out the single-transaction
servers:

    .venv/bin/python bench/http_load.py --ledger --paths group --before HEAD~3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The merge commit just before the lean request path (issue 13, item 2).
DEFAULT_BASELINE = "d64a03c"
ADMIN = "bench-admin"
USER = "bench-user"
TICK = os.sysconf("SC_CLK_TCK")

# http "served": the options `dpicl serve` passes (httptools under the head limits of
# dpicl.api.http_limits, the connection limit), so "lean" measures what is served.
SERVE = """
import sys, uvicorn
from dpicl.api.app import build_app
from dpicl.config import Settings
port, loop, http = int(sys.argv[1]), sys.argv[2], sys.argv[3]
settings = Settings()
if getattr(settings, "workers", 1) > 1:  # DPICL_WORKERS (this checkout): supervisor, workers
    from dpicl.api.workers import serve_workers
    serve_workers(settings.model_copy(update={"host": "127.0.0.1", "port": port}))
    sys.exit(0)
opts = {"http": http}
if http == "served":
    from dpicl.api.http_limits import uvicorn_options
    opts = uvicorn_options(settings)
uvicorn.run(build_app(settings), host="127.0.0.1", port=port, loop=loop,
            log_level="warning", access_log=False, **opts)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def extract(rev: str, into: Path) -> Path:
    """``services/`` of git revision ``rev`` under ``into``; returns the import root."""
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "services/dpicl"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into / "services"


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int

    def cpu_s(self) -> float:
        """CPU seconds of the server and every process under it (DPICL_WORKERS' workers)."""
        stats: dict[int, list[str]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                stats[int(stat.parent.name)] = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, ValueError):  # a process that just ended
                continue
        tree, grew = {self.proc.pid}, True
        while grew:
            below = {pid for pid, f in stats.items() if int(f[1]) in tree} - tree  # f[1]: ppid
            tree |= below
            grew = bool(below)
        # utime + stime of each (a worker's own, while it runs: not yet its parent's cutime)
        return sum(int(stats[p][11]) + int(stats[p][12]) for p in tree if p in stats) / TICK

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start(name: str, pythonpath: Path, workdir: Path, loop: str, http: str, **env: str) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    full_env = os.environ | {
        "PYTHONPATH": str(pythonpath),
        "DPICL_ENGINE": "oracle",
        "DPICL_DATABASE_URL": f"sqlite:///{workdir / 'bench.db'}",
        "DPICL_ADMIN_TOKEN": ADMIN,
        "DPICL_API_KEYS": USER,
        "DPICL_LOG_LEVEL": "warning",
        "HF_HUB_OFFLINE": "1",
    }
    full_env |= env
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port), loop, http],
        env=full_env,
        cwd=workdir,
        stdout=(workdir / "server.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    return Server(name, proc, port)


async def send(
    port: int, method: str, path: str, token: str, body: object | None = None
) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(http_request(method, path, token, body))
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()


def http_request(method: str, path: str, token: str, body: object | None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    return status, await reader.readexactly(length)


async def ready_and_warm(servers: list[Server], args: argparse.Namespace) -> dict[str, str]:
    """Wait for every server, create one context on each (its id by server name) and warm
    each up (imports, first charge, caches) before anything is timed."""
    for s in servers:
        await wait_ready(s)
    cids = {s.name: await create_context(s) for s in servers}
    for s in servers:
        await load(s, cids[s.name], max(50, args.requests // 10), args.concurrency)
    return cids


async def wait_ready(server: Server, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server {server.name} exited early; see its server.log")
        try:
            status, _ = await send(server.port, "GET", "/readyz", ADMIN)
            if status == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"server {server.name} did not become ready")


CONTEXT = {
    "task": "classification",
    "labels": ["Yes", "No"],
    "exemplars": [
        {"input": f"exemplar number {i} about topic {i % 7}", "output": "Yes" if i % 2 else "No"}
        for i in range(16)
    ],
    # A large budget at a small per-answer epsilon: every benchmark query is charged (the
    # full conditional UPDATE), none is refused.
    "mechanism": {"name": "voting", "epsilon": 0.1, "delta": 1e-6, "partitions": 4},
    "budget": {"epsilon": 1000.0, "delta": 1e-5},
}


async def create_context(server: Server) -> str:
    status, body = await send(server.port, "POST", "/v1/contexts", ADMIN, CONTEXT)
    if status != 201:
        raise RuntimeError(f"{server.name}: creating the context answered {status}: {body!r}")
    return str(json.loads(body)["id"])


@dataclass
class Round:
    rps: float
    cpu_ms: float
    p50_ms: float
    p99_ms: float
    busy: int = 0  # 503 storage_unavailable answers (a charge's busy timeout ran out)


async def load(server: Server, cid: str, n: int, concurrency: int) -> Round:
    """``n`` classify requests over ``concurrency`` keep-alive connections."""
    payloads = [
        http_request("POST", "/v1/classify", USER, {"context_id": cid, "query": f"question {i}"})
        for i in range(n)
    ]
    latencies: list[float] = []
    next_i = 0
    busy = 0

    async def worker() -> None:
        nonlocal next_i, busy
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            while next_i < n:
                i = next_i
                next_i += 1
                t0 = time.perf_counter()
                writer.write(payloads[i])
                status, body = await read_response(reader)
                latencies.append(time.perf_counter() - t0)
                if status == 503:  # storage_unavailable: the busy timeout ran out
                    busy += 1
                elif status != 200:
                    raise RuntimeError(f"{server.name} answered {status}: {body[:300]!r}")
        finally:
            writer.close()

    cpu0 = server.cpu_s()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu = server.cpu_s() - cpu0
    latencies.sort()
    return Round(
        rps=n / wall,
        cpu_ms=1000 * cpu / n,
        p50_ms=1000 * latencies[len(latencies) // 2],
        p99_ms=1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        busy=busy,
    )


def median_round(rounds: list[Round]) -> Round:
    return Round(
        rps=statistics.median(r.rps for r in rounds),
        cpu_ms=statistics.median(r.cpu_ms for r in rounds),
        p50_ms=statistics.median(r.p50_ms for r in rounds),
        p99_ms=statistics.median(r.p99_ms for r in rounds),
        busy=sum(r.busy for r in rounds),
    )


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Round]:
    base_path = extract(args.baseline, tmp / "baseline")
    here = ROOT / "services"
    servers = [
        start("before", base_path, tmp / "before", "asyncio", "h11"),
        start("lean", here, tmp / "lean", "auto", "served"),
        start(
            "lean, unserialised",
            here,
            tmp / "unserialised",
            "auto",
            "served",
            DPICL_DB_SERIALIZE_SQLITE_WRITES="false",
        ),
        # The served options' own cost: the same checkout on uvicorn's plain httptools
        # protocol, without the head limits (and without the connection limit).
        start("lean, no head limits", here, tmp / "plain", "auto", "httptools"),
    ]
    try:
        cids = await ready_and_warm(servers, args)
        rounds: dict[str, list[Round]] = {s.name: [] for s in servers}
        for r in range(args.rounds):
            for s in servers:
                res = await load(s, cids[s.name], args.requests, args.concurrency)
                rounds[s.name].append(res)
                print(
                    f"  round {r + 1} {s.name:>20}: {res.rps:7.0f} req/s  "
                    f"{res.cpu_ms:5.2f} ms CPU/req  p50 {res.p50_ms:6.1f} ms  "
                    f"p99 {res.p99_ms:6.1f} ms  503s {res.busy}",
                    flush=True,
                )
        return {name: median_round(rs) for name, rs in rounds.items()}
    finally:
        for s in servers:
            s.stop()


#: The PostgreSQL server the ledger benchmark creates its databases on (as the tests do).
PG_ADMIN_URL = os.environ.get("DPICL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: The charge paths compared by --ledger: DPICL_LEDGER_GROUP_COMMIT_MS of each; "workers" is
#: group commit in --workers server processes on one port (DPICL_WORKERS).
CHARGE_PATHS = {"single": "0", "group": "5", "workers": "5"}


def pg_databases(admin_url: str, names: list[str], *, drop: bool) -> list[str]:
    """Create (or drop) fresh databases on ``admin_url``'s server; their URLs."""
    import sqlalchemy as sa

    eng = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            for name in names:
                if drop:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                else:
                    conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        eng.dispose()
    return [admin_url.rsplit("/", 1)[0] + "/" + name for name in names]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def ledger_variants(args: argparse.Namespace) -> list[tuple[str, dict[str, str], str | None]]:
    """The servers of --ledger, per database: (name, their DPICL_* settings, the git revision
    it runs, None for this checkout). ``--before REV`` adds REV's server with group commit,
    so a change is measured against the code before it in the same run."""
    out: list[tuple[str, dict[str, str], str | None]] = []
    for path in args.paths.split(","):
        env = {"DPICL_LEDGER_GROUP_COMMIT_MS": CHARGE_PATHS[path]}
        if path == "workers":
            env["DPICL_WORKERS"] = str(args.workers)
            path = f"group, {args.workers} workers"
        out.append((path, env, None))
    if args.before:
        group = {"DPICL_LEDGER_GROUP_COMMIT_MS": CHARGE_PATHS["group"]}
        out.append((f"group @{args.before}", group, args.before))
    return out


def ledger_names(args: argparse.Namespace) -> list[str]:
    return [f"{db}, {v[0]}" for db in ("sqlite", "postgresql") for v in ledger_variants(args)]


async def run_ledger(args: argparse.Namespace, tmp: Path, pg_urls: dict[str, str]) -> None:
    here = ROOT / "services"
    trees = {
        rev: extract(rev, tmp / f"rev-{rev}")
        for _, _, rev in ledger_variants(args)
        if rev is not None
    }
    servers = []
    for db in ("sqlite", "postgresql"):
        for path, settings, rev in ledger_variants(args):
            name = f"{db}, {path}"
            env = dict(settings)
            if db == "postgresql":
                env["DPICL_DATABASE_URL"] = pg_urls[name]
            tree = here if rev is None else trees[rev]
            workdir = tmp / name.replace(", ", "-").replace(" @", "-").replace(" ", "-")
            servers.append(start(name, tree, workdir, "auto", "served", **env))
    levels = (1, args.concurrency)
    try:
        cids = await ready_and_warm(servers, args)
        rounds: dict[tuple[str, int], list[Round]] = {}
        for r in range(args.rounds):
            for s in servers:
                for c in levels:
                    res = await load(s, cids[s.name], args.requests, c)
                    rounds.setdefault((s.name, c), []).append(res)
                    print(
                        f"  round {r + 1} {s.name:>18} c={c:<3}: {res.rps:7.0f} req/s  "
                        f"{res.cpu_ms:5.2f} ms CPU/req  p50 {res.p50_ms:6.1f} ms  "
                        f"p99 {res.p99_ms:6.1f} ms  503s {res.busy}  load {load_average()}",
                        flush=True,
                    )
    finally:
        for s in servers:
            s.stop()
    med = {k: median_round(v) for k, v in rounds.items()}
    print(f"\nmedians (requests/s), load average now {load_average()}:")
    print(f"  {'':>18}  {'c=1':>8}  {f'c={args.concurrency}':>8}  ratio c={args.concurrency}/c=1")
    for s in servers:
        one, many = med[(s.name, 1)], med[(s.name, args.concurrency)]
        print(
            f"  {s.name:>18}  {one.rps:8.0f}  {many.rps:8.0f}  x{many.rps / one.rps:.2f}"
            f"   (p99 c={args.concurrency}: {many.p99_ms:.1f} ms, 503s {many.busy})"
        )
    c = args.concurrency
    for db in ("sqlite", "postgresql"):
        if {f"{db}, single", f"{db}, group"} <= {s.name for s in servers}:
            single, group = med[(f"{db}, single", c)], med[(f"{db}, group", c)]
            print(f"requests/s at c={c}, group / single, {db}: x{group.rps / single.rps:.2f}")
        if args.before and f"{db}, group" in {s.name for s in servers}:
            now, then = f"{db}, group", f"{db}, group @{args.before}"
            print(
                f"{db}, this checkout / {args.before}, group commit: c={c} requests/s "
                f"x{med[(now, c)].rps / med[(then, c)].rps:.2f}, c={c}/c=1 ratio "
                f"x{med[(now, c)].rps / med[(now, 1)].rps:.2f} against "
                f"x{med[(then, c)].rps / med[(then, 1)].rps:.2f}"
            )


def main_ledger(args: argparse.Namespace) -> None:
    print(
        f"ledger: oracle /v1/classify, T=4, {args.requests} requests x {args.rounds} "
        f"interleaved rounds at concurrency 1 and {args.concurrency}; charge paths "
        f"{CHARGE_PATHS} (DPICL_LEDGER_GROUP_COMMIT_MS); SQLite and PostgreSQL "
        f"({args.pg_url.rsplit('@', 1)[-1]}); this checkout against {args.before or 'nothing'}; "
        f"load average {load_average()}",
        flush=True,
    )
    names = [n for n in ledger_names(args) if n.startswith("postgresql")]
    dbs = [f"dpicl_bench_{uuid.uuid4().hex[:12]}" for _ in names]
    pg_urls = dict(zip(names, pg_databases(args.pg_url, dbs, drop=False), strict=True))
    try:
        with tempfile.TemporaryDirectory(prefix="dpicl-bench-ledger-") as tmp:
            asyncio.run(run_ledger(args, Path(tmp), pg_urls))
    finally:
        pg_databases(args.pg_url, dbs, drop=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few hundred requests (tests)")
    p.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of 'before'")
    p.add_argument("--requests", type=int, default=3000, help="requests per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--ledger",
        action="store_true",
        help="concurrency 16 against 1, one transaction per charge against group commit, "
        "on SQLite and PostgreSQL",
    )
    p.add_argument("--pg-url", default=PG_ADMIN_URL, help="PostgreSQL for --ledger")
    p.add_argument(
        "--paths",
        default="single,group,workers",
        help="--ledger: the charge paths of this checkout to run (of single,group,workers)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="--ledger: server processes of the 'workers' path (default: this machine's cores)",
    )
    p.add_argument(
        "--before",
        default=None,
        metavar="REV",
        help="--ledger: also run git revision REV's server (group commit), side by side",
    )
    args = p.parse_args()
    if args.quick:
        args.requests, args.rounds, args.concurrency = 200, 1, 4
    if args.ledger:
        main_ledger(args)
        return
    print(
        f"oracle /v1/classify on SQLite, T=4, {args.requests} requests x {args.rounds} "
        f"interleaved rounds, {args.concurrency} keep-alive connections; before = "
        f"{args.baseline} on asyncio/h11, lean = this checkout on uvloop/httptools",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="dpicl-bench-req-") as tmp:
        res = asyncio.run(run(args, Path(tmp)))
    before, lean, unser = res["before"], res["lean"], res["lean, unserialised"]
    print("\nmedians:")
    for name, r in res.items():
        print(
            f"  {name:>20}: {r.rps:7.0f} req/s  {r.cpu_ms:5.2f} ms CPU/req  "
            f"p50 {r.p50_ms:6.1f} ms  p99 {r.p99_ms:6.1f} ms  503s (all rounds) {r.busy}"
        )
    print(f"\nrequests/s, lean / before:              x{lean.rps / before.rps:.2f}")
    print(f"server CPU per request, before / lean:  x{before.cpu_ms / lean.cpu_ms:.2f}")
    print(f"SQLite p99, unserialised / serialised:   x{unser.p99_ms / lean.p99_ms:.2f}")
    plain = res["lean, no head limits"]
    print(f"server CPU per request, head limits / none: x{lean.cpu_ms / plain.cpu_ms:.3f}")


if __name__ == "__main__":
    main()
