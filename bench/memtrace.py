"""What grows in a soak's processes (bench only; ``bench/soak.py --trace``).

``install()`` runs in every process the soak starts (server and engine) through a
``sitecustomize`` the soak writes into its temporary folder and puts on ``PYTHONPATH``;
the server's own code knows nothing of it. Where ``DPICL_SOAK_TRACE_DIR`` is set, the first
``SIGUSR1`` (sent after warm-up) starts :mod:`tracemalloc`, so only what is allocated from
then on is traced (tracing the imports too made each snapshot take minutes on two shared
cores), and every ``SIGUSR1`` writes into that folder, after a full collection:

* ``<pid>-<n>.snap``: a tracemalloc snapshot (Python allocations made since tracing began
  and still alive, by allocating line and its callers);
* ``<pid>-<n>.json``: live objects that the collector tracks (containers: not ``str``
  or ``int``) counted by type (the objgraph way), the asyncio tasks
  of the running loop, and memory outside Python's objects: SQLite's own allocations
  (``sqlite3_memory_used``: page caches, statements) and glibc's heap (``mallinfo2``:
  in use, and freed but kept), so RSS growth can be split into Python objects, SQLite and
  allocator free space.

:func:`compare` reads two such pairs of one process and returns what grew between them.
tracemalloc costs time and memory of its own: the RSS of a traced run is not the bar's
figure (the soak says so and never judges a traced run).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
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


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33): every field a size_t.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _c_heap() -> dict[str, int]:
    """SQLite's and glibc's bytes (-1 where the library or symbol is missing)."""
    out = {"sqlite_bytes": -1, "malloc_in_use": -1, "malloc_free": -1}
    try:
        sqlite = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
        sqlite.sqlite3_memory_used.restype = ctypes.c_int64
        out["sqlite_bytes"] = int(sqlite.sqlite3_memory_used())
    except (OSError, AttributeError):
        pass
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        m = libc.mallinfo2()
        out["malloc_in_use"] = int(m.uordblks + m.hblkhd)
        out["malloc_free"] = int(m.fordblks)
    except (OSError, AttributeError):
        pass
    return out


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
        **_c_heap(),
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
        f"{jb['allocated_blocks']}; asyncio tasks {ja['asyncio_tasks']} -> {jb['asyncio_tasks']}",
        "  outside Python's objects (MB): "
        + "; ".join(
            f"{k} {ja[k] / 2**20:.2f} -> {jb[k] / 2**20:.2f}"
            for k in ("sqlite_bytes", "malloc_in_use", "malloc_free")
        ),
    ]
    for stat in b.compare_to(a, "traceback")[:top]:
        if stat.size_diff <= 0:
            break
        # The allocating line first, then its callers (a Traceback runs oldest first).
        frames = reversed(stat.traceback)
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames)
        lines.append(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {where}")
    grown = {t: n - ja["types"].get(t, 0) for t, n in jb["types"].items()}
    ranked = sorted(grown.items(), key=lambda kv: -kv[1])[:top]
    lines.append("  objects by type: " + ", ".join(f"{t} {d:+d}" for t, d in ranked if d > 0))
    return lines
