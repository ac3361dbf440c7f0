"""What the voting and throughput benchmarks share: a news-classification context in a
throw-away SQLite store, and interleaved timing (A, B, C, A, B, C, ...; medians), which
keeps a noisy shared machine fair to every side of a ratio."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dpicl.privacy.accounting import MU2_RTOL
from dpicl.serving.contexts import create_context
from dpicl.spec import ContextSpec
from dpicl.store.repository import ContextRepository, StoredContext

CACHE_DIR = Path.home() / ".cache" / "dpicl"
LABELS = ["World", "Sports", "Business", "Sci/Tech"]
TEXTS = [
    ("The central bank raised interest rates again", "Business"),
    ("The striker scored twice in the derby", "Sports"),
    ("A faster quantum processor was unveiled", "Sci/Tech"),
    ("Leaders met in Geneva about the ceasefire", "World"),
]
QUERIES = [
    "Shares fell sharply after the earnings report",
    "The goalkeeper saved a late penalty",
    "A new vaccine passed its final trial",
    "Talks on the trade deal stalled again",
]


@contextmanager
def temp_repo() -> Iterator[ContextRepository]:
    with tempfile.TemporaryDirectory() as d:
        repo = ContextRepository(f"sqlite:///{Path(d) / 'bench.db'}", rtol=MU2_RTOL)
        repo.create_schema()
        try:
            yield repo
        finally:
            repo.dispose()


async def news_context(
    repo: ContextRepository, partitions: int, *, seed: int = 1, per_partition: int = 2
) -> StoredContext:
    """A voting context with ``per_partition`` exemplars in each of ``partitions``."""
    n = partitions * per_partition
    spec = ContextSpec.model_validate(
        {
            "task": "classification",
            "labels": LABELS,
            "exemplars": [
                {"input": f"{TEXTS[i % 4][0]} (report {i})", "output": TEXTS[i % 4][1]}
                for i in range(n)
            ],
            "mechanism": {
                "name": "voting",
                "epsilon": 1.0,
                "partitions": partitions,
                "partition_seed": seed,
            },
        }
    )
    return await create_context(spec, repo)


def query(i: int) -> str:
    """Distinct queries (the i-th of an endless list)."""
    return f"{QUERIES[i % len(QUERIES)]} (item {i})"


async def interleaved(
    sides: dict[str, Callable[[], Awaitable[object]]], reps: int, *, warmup: bool = True
) -> dict[str, float]:
    """Median seconds of each side, the sides run in turn ``reps`` times."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    if warmup:
        for fn in sides.values():
            await fn()
    for _ in range(reps):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            await fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
