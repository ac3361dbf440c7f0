"""What grows in a soak's processes (bench only; ``bench/soak.py --trace``).

``install()`` runs in every process the soak starts (server and engine) through a
``sitecustomize`` the soak writes into its temporary folder and puts on ``PYTHONPATH``;
the server's own code knows nothing of it. Where ``DPICL_SOAK_TRACE_DIR`` is set, the first
``SIGUSR1`` (sent after warm-up) starts :mod:`tracemalloc`, so only what is allocated from
then on is traced (tracing the imports too made each snapshot take minutes on two shared
cores), and every ``SIGUSR1`` writes into that folder, after a full collection:

* ``<pid>-<n>.snap``: a tracemalloc snapshot (Python allocations made since tracing began
  and still alive, by allocating line and its callers);
* ``<pid>-<n>.json``: live objects counted by type (the objgraph way), the asyncio tasks
  of the running loop, and the C allocator's view (``sys._debugmallocstats`` is too
  verbose; the interpreter's allocated blocks are enough to tell Python heap from the rest).

:func:`compare` reads two such pairs of one process and returns what grew between them.
tracemalloc costs time and memory of its own: the RSS of a traced run is not the bar's
figure (the soak says so and never judges a traced run).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import json
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

DIR_VAR = "DPICL_SOAK_TRACE_DIR"
#: Frames kept per allocation: the line that allocated and four callers above it.
FRAMES = 5


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def _dump(out: Path, seq: int) -> None:
    gc.collect()
    pid = os.getpid()
    if not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
    tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),)
    ).dump(str(out / f"{pid}-{seq}.snap"))
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    try:
        tasks = len(asyncio.all_tasks(asyncio.get_running_loop()))
    except RuntimeError:  # the signal arrived outside the loop (start-up, shut-down)
        tasks = -1
    info = {
        "pid": pid,
        "traced_bytes": tracemalloc.get_traced_memory()[0],
        "rss_kib": _rss_kib(),
        "allocated_blocks": sys.getallocatedblocks(),
        "asyncio_tasks": tasks,
        "types": dict(types.most_common(400)),
    }
    (out / f"{pid}-{seq}.json").write_text(json.dumps(info))


def install() -> None:
    """Trace this process if the soak asked for it (see the module docstring)."""
    folder = os.environ.get(DIR_VAR)
    if not folder:
        return
    out = Path(folder)
    counter = itertools.count()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        _dump(out, next(counter))

    signal.signal(signal.SIGUSR1, on_signal)


def compare(before: Path, after: Path, top: int = 12) -> list[str]:
    """What grew in one process from snapshot ``before`` to ``after`` (``.snap`` paths;
    their ``.json`` beside them): lines of text, largest growth first."""
    a = tracemalloc.Snapshot.load(str(before))
    b = tracemalloc.Snapshot.load(str(after))
    ja = json.loads(before.with_suffix(".json").read_text())
    jb = json.loads(after.with_suffix(".json").read_text())
    lines = [
        f"RSS {ja['rss_kib'] / 1024:.1f} -> {jb['rss_kib'] / 1024:.1f} MB; "
        f"traced Python memory {ja['traced_bytes'] / 2**20:.2f} -> "
        f"{jb['traced_bytes'] / 2**20:.2f} MB; allocated blocks {ja['allocated_blocks']} -> "
        f"{jb['allocated_blocks']}; asyncio tasks {ja['asyncio_tasks']} -> {jb['asyncio_tasks']}"
    ]
    for stat in b.compare_to(a, "traceback")[:top]:
        if stat.size_diff <= 0:
            break
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback)
        lines.append(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {where}")
    grown = {t: n - ja["types"].get(t, 0) for t, n in jb["types"].items()}
    ranked = sorted(grown.items(), key=lambda kv: -kv[1])[:top]
    lines.append("  objects by type: " + ", ".join(f"{t} {d:+d}" for t, d in ranked if d > 0))
    return lines
