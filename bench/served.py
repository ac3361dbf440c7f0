"""What ``dpicl serve`` serves: voting queries over HTTP against a real server process, at
several concurrencies, on the native route (``/v1/classify``) and the OpenAI route
(``/v1/chat/completions``), with the GPU's utilisation and the CPU of the server's
processes sampled during each level. Used by ``bench/gpu.py --served``.

Each server is one ``dpicl serve`` process (with ``DPICL_LOAD_FORMAT=dummy`` and a model
directory of a config and a tokenizer: random weights of the model's shape; or the last
model of ``--models``, e.g. the bundled one with its weights), started in turn with one of
the ``SERVERS`` environments and loaded by the same client:

* ``served``: the defaults; only the device, the model and the load format are set.
* ``in-process``: the same with ``DPICL_ENGINE_PROCESS=off``: the engine in the server's
  own process, for the engine process's effect alone.
* ``timer-2ms``, ``cache-256``, ``float32`` (asked for by name): the defaults with one of
  issue 36's changes undone (the 2 ms batching timer, the 256 MiB prefix cache, float32).
* ``as-shipped``: the defaults before issue 36 (float32 weights, the engine in the
  server's process, a 2 ms batching timer, a 256 MiB prefix cache), set by their settings
  on this checkout.

* ``copied-prefix`` / ``shared-prefix``: ``DPICL_SHARED_PREFIX`` off / on (cached prefixes
  copied per row, or attended in place; issue 46), and ``overlap`` / ``no-overlap``:
  ``DPICL_ENGINE_OVERLAP`` on / off (the next scoring batch launched before the last is read
  back), each the defaults with one switch set.
* ``before``: the defaults, run from another checkout's ``services`` directory (the
  environment variable ``DPICL_BENCH_BEFORE``, e.g. ``git archive main services | tar -x``):
  the same load on the code before a change, for a side-by-side comparison in one run
  (``--servers served,before,served,before`` alternates them).

Each level sends ``max(queries, 4 x in flight)`` queries or stops sending after
``level_s`` seconds (5 by default), whichever comes first, so that a slow server's rows end
on time. Calls/s counts T = 10 LLM calls per voting query. "server CPU" is the HTTP process's CPU
time over the level's wall time (cores), "engine CPU" the engine process's, and "engine
ms/call" the engine process's CPU time per LLM call (issue 46: its one thread is the
ceiling).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from http_load import ADMIN, TICK, USER, free_port, http_request, read_response, send

T = 10
LABELS = ["Business", "Sports", "Sci/Tech", "World"]
TOPICS = [
    ("The central bank raised interest rates again this quarter", "Business"),
    ("The striker scored twice in the final minutes of the derby", "Sports"),
    ("Researchers unveiled a faster quantum processor prototype", "Sci/Tech"),
    ("Leaders met in Geneva to discuss the ceasefire proposal", "World"),
]
CONTEXT = {
    "task": "classification",
    "labels": LABELS,
    "exemplars": [
        {"input": f"{TOPICS[i % 4][0]} (report {i})", "output": TOPICS[i % 4][1]}
        for i in range(2 * T)
    ],
    "mechanism": {"name": "voting", "epsilon": 1.0, "delta": 1e-6, "partitions": T},
    "budget": None,  # DPICL_ALLOW_UNBUDGETED: a benchmark is never refused
}
QUERIES = [
    "Oil prices fell sharply after the output agreement",
    "The champion retired after a record tenth title",
    "A new battery chemistry doubles the range of electric cars",
    "Elections were called after the coalition collapsed",
]

#: The servers compared (see the module docstring): environment on top of the common one.
SERVERS: dict[str, dict[str, str]] = {
    "served": {},
    "in-process": {"DPICL_ENGINE_PROCESS": "off"},
    # Not in the default run: one change of issue 36 at a time.
    "timer-2ms": {"DPICL_BATCH_WAIT_MS": "2"},
    "cache-256": {"DPICL_PREFIX_CACHE_MIB": "256"},
    "float32": {"DPICL_DTYPE": "float32"},
    "as-shipped": {
        "DPICL_DTYPE": "float32",
        "DPICL_ENGINE_PROCESS": "off",
        "DPICL_BATCH_WAIT_MS": "2",
        "DPICL_PREFIX_CACHE_MIB": "256",
    },
    "before": {},  # PYTHONPATH set from DPICL_BENCH_BEFORE (run_served)
    # Issue 46's switches, each against the defaults (alternate them for a side by side).
    "copied-prefix": {"DPICL_SHARED_PREFIX": "off"},
    "shared-prefix": {"DPICL_SHARED_PREFIX": "on"},
    "overlap": {"DPICL_ENGINE_OVERLAP": "on"},
    "no-overlap": {"DPICL_ENGINE_OVERLAP": "off"},
}
ROUTES = ("native", "openai")


@dataclass(frozen=True, slots=True)
class ServedRow:
    """One (server, route, concurrency) level."""

    server: str
    route: str
    concurrency: int
    queries: int
    seconds: float
    gpu_busy: float | None  # mean utilisation.gpu over the level, %, or None (no GPU)
    server_cores: float
    engine_cores: float | None  # the engine process's CPU (None: the engine is in-process)

    @property
    def calls_per_s(self) -> float:
        return self.queries * T / self.seconds

    @property
    def engine_ms_per_call(self) -> float | None:
        """The engine process's CPU per LLM call, in milliseconds."""
        if self.engine_cores is None:
            return None
        return 1000 * self.engine_cores / self.calls_per_s


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class GpuSampler:
    """utilisation.gpu of device 0 every 50 ms while running (NVML), where there is one."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml: Any = pynvml
        except Exception:  # no NVML, no GPU: the column reads "-"
            self._handle = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            self.samples.append(float(rates.gpu))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def payload(route: str, cid: str, i: int) -> bytes:
    query = f"{QUERIES[i % len(QUERIES)]} (item {i})"
    if route == "native":
        return http_request("POST", "/v1/classify", USER, {"context_id": cid, "query": query})
    body = {"model": cid, "messages": [{"role": "user", "content": query}]}
    return http_request("POST", "/v1/chat/completions", USER, body)


async def load(
    port: int, route: str, cid: str, n: int, concurrency: int, within_s: float = 1e9
) -> tuple[int, float]:
    """Queries answered and seconds taken: ``n`` queries over ``concurrency`` keep-alive
    connections, or as many as were sent within ``within_s`` (a slow server's level ends
    on time; its rate is what counts)."""
    payloads = [payload(route, cid, i) for i in range(n)]
    next_i = 0
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + within_s

    async def worker() -> None:
        nonlocal next_i, done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while next_i < n and time.perf_counter() < deadline:
                i = next_i
                next_i += 1
                writer.write(payloads[i])
                status, body = await read_response(reader)
                if status != 200:
                    raise RuntimeError(f"{route} answered {status}: {body[:300]!r}")
                done += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.perf_counter() - t0


def tail(log: Path) -> str:
    return log.read_text()[-3000:]


async def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dpicl serve exited early:\n{tail(log)}")
        try:
            status, _ = await send(port, "GET", "/readyz", ADMIN)
            if status == 200:
                return
        except OSError:
            pass
        await asyncio.sleep(0.25)
    raise RuntimeError(f"dpicl serve was not ready in {within_s} s:\n{tail(log)}")


def start_server(
    name: str, env: dict[str, str], tmp: Path
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """One ``dpicl serve`` process with ``env`` on a free port, its own SQLite file and log."""
    work = tmp / name
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = work / "server.log"
    full = (
        os.environ
        | {
            "DPICL_PORT": str(port),
            "DPICL_DATABASE_URL": f"sqlite:///{work / 'bench.db'}",
            "DPICL_ADMIN_TOKEN": ADMIN,
            "DPICL_API_KEYS": USER,
            "DPICL_ALLOW_UNBUDGETED": "true",
            "DPICL_LOG_LEVEL": "warning",
            "DPICL_PRELOAD_EMBEDDER": "false",
            "HF_HUB_OFFLINE": "1",
        }
        | env
    )
    cmd = [sys.executable, "-c", "from dpicl.cli import app; app()", "serve"]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=full, cwd=work, stdout=sink, stderr=subprocess.STDOUT)
    return proc, port, log


async def measure_server(
    name: str,
    server: tuple[subprocess.Popen[bytes], int, Path],
    levels: Sequence[int],
    queries: int,
    out: Path | None,
    level_s: float,
    context: dict[str, Any],
) -> list[ServedRow]:
    """Load one started server at every level on both routes, then stop it."""
    proc, port, log = server
    rows: list[ServedRow] = []
    try:
        await wait_ready(proc, port, log, within_s=600)
        status, body = await send(port, "GET", "/readyz", ADMIN)
        ready = json.loads(body)
        print(
            f"  {name}: dtype {ready.get('dtype')}, load format {ready.get('load_format')}, "
            f"engine pid {ready.get('engine_pid')}, prefix cache {ready.get('prefix_cache_mib')}"
            " MiB",
            flush=True,
        )
        status, body = await send(port, "POST", "/v1/contexts", ADMIN, context)
        if status != 201:
            raise RuntimeError(f"creating the context answered {status}: {body[:300]!r}")
        cid = str(json.loads(body)["id"])
        for route in ROUTES:
            await load(port, route, cid, max(8, levels[-1]), levels[-1], level_s)  # warm-up
            for c in levels:
                n = max(queries, 4 * c)
                kids = _children(proc.pid)
                ticks0 = _cpu_ticks(proc.pid), [_cpu_ticks(k) for k in kids]
                with GpuSampler() as gpu:
                    n, seconds = await load(port, route, cid, n, c, level_s)
                server_s = (_cpu_ticks(proc.pid) - ticks0[0]) / TICK
                engine_s = sum(_cpu_ticks(k) - t for k, t in zip(kids, ticks0[1], strict=True))
                row = ServedRow(
                    name,
                    route,
                    c,
                    n,
                    seconds,
                    gpu.mean,
                    server_s / seconds,
                    engine_s / TICK / seconds if kids else None,
                )
                show(row, out)
                rows.append(row)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows


HEADER = (
    f"{'server':<12}{'route':<8}{'in flight':>10}{'queries':>9}{'calls/s':>10}"
    f"{'GPU busy':>10}{'server CPU':>12}{'engine CPU':>12}{'engine ms/call':>16}"
)


def show(row: ServedRow, out: Path | None) -> None:
    gpu = "-" if row.gpu_busy is None else f"{row.gpu_busy:.0f}%"
    eng = "-" if row.engine_cores is None else f"{row.engine_cores:.2f}"
    per = "-" if row.engine_ms_per_call is None else f"{row.engine_ms_per_call:.2f}"
    print(
        f"{row.server:<12}{row.route:<8}{row.concurrency:>10}{row.queries:>9}"
        f"{row.calls_per_s:>10.1f}{gpu:>10}{row.server_cores:>12.2f}{eng:>12}{per:>16}",
        flush=True,
    )
    if out is not None:
        with out.open("a") as f:
            extra = {"calls_per_s": row.calls_per_s, "engine_ms_per_call": row.engine_ms_per_call}
            f.write(json.dumps(asdict(row) | extra) + "\n")


def run_served(
    model_dir: Path,
    random_weights: bool,
    device: str,
    servers: Sequence[str],
    levels: Sequence[int],
    queries: int,
    out: Path | None,
    level_s: float = 5.0,
    *,
    exemplars: Sequence[tuple[str, str]] | None = None,
) -> list[ServedRow]:
    """Every server of ``servers`` in turn, each loaded at ``levels`` on both routes, on a
    context of ``exemplars`` (input, output) pairs (default: ``CONTEXT``'s, 2 short ones per
    partition; ``bench/gpu.py --shots K`` gives K realistic ones per partition)."""
    unknown = sorted(set(servers) - set(SERVERS))
    if unknown:
        raise SystemExit(f"unknown server(s) {unknown}; expected some of {', '.join(SERVERS)}")
    common = {
        "DPICL_ENGINE": "transformers",
        "DPICL_DEVICE": device,
        "DPICL_MODEL": str(model_dir),
        "DPICL_LOAD_FORMAT": "dummy" if random_weights else "auto",
    }
    context = CONTEXT
    if exemplars is not None:
        context = CONTEXT | {"exemplars": [{"input": i, "output": o} for i, o in exemplars]}
    weights = "random weights" if random_weights else "its weights"
    print(f"served: dpicl serve over HTTP, {model_dir.name}, {weights}, device {device}")
    print(HEADER, flush=True)
    rows: list[ServedRow] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in servers:
            env = common | SERVERS[name]
            if name == "before":
                before = os.environ.get("DPICL_BENCH_BEFORE")
                if not before:
                    raise SystemExit("server 'before' needs DPICL_BENCH_BEFORE (a services dir)")
                env |= {"PYTHONPATH": str(Path(before).resolve())}
            server = start_server(name, env, Path(tmp))
            rows += asyncio.run(
                measure_server(name, server, levels, queries, out, level_s, context)
            )
    return rows
