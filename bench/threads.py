"""torch CPU threads: 1 against 2 (or ``--threads A,B``) on served voting queries, side by side.

Which thread count serves best depends on what else the machine runs: on a quiet 2-core
machine two threads split each matrix product; on a loaded one the second thread mostly
waits for a core and costs CPU (issue 30 measured x4.5 in favour of one thread there). So
this prints, measured in one run with the counts interleaved (A, B, A, B, ...; medians):

* warm: a whole voting query (``run_voting``: prompts, SQLite ledger charge, label scoring,
  noise) at T = 10 with the context's prefix KV cache warm (the served steady state);
* cold: the same with the prefix cache cleared before each query (a context's first query);
* 16 concurrent: 16 warm queries in flight at once, through the engine's micro-batcher.

For each it gives the wall time and the process CPU time per query, and the ratio of the
first count's wall time to the second's (> 1: the second count is faster). The load average
is printed beside, since the answer depends on it. ``DPICL_TORCH_THREADS`` picks the count
for a server (README, "Threads").

    .venv/bin/python bench/threads.py [--reps 6] [--threads 1,2] [--quick] [--busy N]

``--busy N`` runs N busy-looping processes beside the measurement (a machine whose cores are
shared with other busy work, made the same way every time) and stops them after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import numpy as np
import torch

from dpicl.engines.factory import build_engine
from dpicl.engines.threads import usable_cores
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.mechanisms.voting.pipeline import run_voting
from dpicl.privacy.ledger import Ledger
from voting_setup import CACHE_DIR, news_context, query, temp_repo


async def timed(fn: Callable[[], Awaitable[int]]) -> tuple[float, float, int]:
    """Wall seconds, process CPU seconds and the number of queries of one call of ``fn``."""
    w0, c0 = time.perf_counter(), time.process_time()
    n = await fn()
    return time.perf_counter() - w0, time.process_time() - c0, n


async def compare(
    engine: TransformersEngine, counts: list[int], reps: int, partitions: int
) -> None:
    with temp_repo() as repo:
        ledger = Ledger(repo)
        ctx = await news_context(repo, partitions)
        rng = np.random.default_rng()
        counter = iter(range(10**9))

        async def one() -> None:
            await run_voting(ctx, query(next(counter)), engine=engine, ledger=ledger, rng=rng)

        async def warm() -> int:
            await one()
            return 1

        async def cold() -> int:
            engine.prefix_cache.clear()
            await one()
            return 1

        async def burst() -> int:
            await asyncio.gather(*(one() for _ in range(16)))
            return 16

        for name, fn in (("warm", warm), ("cold", cold), ("16 concurrent", burst)):
            await fn()  # warm-up: caches, allocator
            wall: dict[int, list[float]] = {c: [] for c in counts}
            cpu: dict[int, list[float]] = {c: [] for c in counts}
            ran: dict[int, set[int]] = {c: set() for c in counts}
            for _ in range(reps):
                for c in counts:
                    # The engine's own plan, which it applies in the thread that runs the
                    # model (engines/transformers/runner.py): torch.set_num_threads here, in
                    # this thread, would leave a worker thread that already ran the model at
                    # its count.
                    assert engine.threads is not None
                    engine.threads = replace(engine.threads, intra=c)
                    w, u, n = await timed(fn)
                    wall[c].append(w / n)
                    cpu[c].append(u / n)
                    ran[c].add(await engine.run(torch.get_num_threads))
            if any(ran[c] != {c} for c in counts):
                raise SystemExit(f"the model did not run with the asked-for threads: {ran}")
            med = {c: statistics.median(wall[c]) for c in counts}
            parts = ", ".join(
                f"{c} thread{'s' if c > 1 else ''} {med[c] * 1e3:7.1f} ms "
                f"(CPU {statistics.median(cpu[c]) * 1e3:7.1f} ms)"
                for c in counts
            )
            a, b = counts[0], counts[1]
            print(
                f"[{name:<13}] per query at T={partitions}: {parts} -> "
                f"{a} vs {b} threads: x{med[a] / med[b]:.2f} (wall of {a} / wall of {b}; "
                f"range of {a}: {min(wall[a]) * 1e3:.0f}-{max(wall[a]) * 1e3:.0f} ms; the "
                f"model ran with {a} and {b})",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--threads", default="1,2", help="two thread counts to compare")
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="2 repetitions, T = 4 (a smoke run)")
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes beside")
    args = ap.parse_args()
    counts = [int(x) for x in args.threads.split(",")]
    if len(counts) != 2 or min(counts) < 1:
        raise SystemExit(f"--threads takes two counts >= 1, got {args.threads!r}")
    reps, partitions = (2, 4) if args.quick else (args.reps, args.partitions)
    print(
        f"machine: {os.cpu_count()} CPUs, {usable_cores()} usable by this process; "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    engine = build_engine("transformers", cache_dir=CACHE_DIR)
    assert isinstance(engine, TransformersEngine)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    if busy:
        print(f"{len(busy)} busy-looping processes beside the measurement")
    try:
        asyncio.run(compare(engine, counts, reps, partitions))
    finally:
        for p in busy:
            p.kill()
            p.wait()
        asyncio.run(engine.aclose())
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
