"""A micro-batcher: merge the jobs of concurrent requests into one engine run.

Requests that arrive together (within ``max_wait_s`` of the first, or while the previous
batch is running) are handed to ``run`` as one list, up to ``max_size`` units of work (a
job of more units than that runs alone); ``run`` returns one result or one exception per
job, in order, and each is routed back to the request that submitted that job and to no
other. One drain task per event loop takes batches in arrival order, so a job never waits
behind more than the batch already running plus its own window.

Callers that come back. Callers usually send their next job soon after their last one is
answered (a closed loop: a client with a queue of queries, a pipeline that scores then
generates). Without care, the callers of one batch return while the jobs that queued during
it are already being taken, and batches settle into alternating halves. So after each run
the batcher remembers how many callers were active (the jobs of that batch plus those that
queued during it) and lets the next batch wait for that many jobs, for at most
``rejoin_fraction`` of the last run's duration (capped at ``max_rejoin_s``), before it
starts: a lone caller never waits, and a caller that went away costs each later batch at
most that window once.

Cancelling a waiting request drops its job before it reaches the engine; a job already in
a running batch finishes and its result is discarded.

Overlap (``launch``, issue 46 item 2). On a GPU a batch's forward is queued on the device
and the host is free until it reads the results back. With ``launch``, the batcher launches
a batch, and when jobs are waiting (or arrive while the event loop looks once more) takes
and launches the next one before reading the first back, so the host lays out batch n + 1
while the device runs batch n and no batch waits for a synchronisation it does not need.
Results still reach their callers in batch order. Without jobs behind it, a batch is read
back at once. On the CPU the forward has run when ``launch`` returns, so overlap would
only hold each batch's answers back until the next batch had run.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dpicl.metrics import (
    BATCH_SIZE,
    ENGINE_REQUESTS_RUNNING,
    ENGINE_REQUESTS_WAITING,
    QUEUE_WAIT_SECONDS,
)

__all__ = ["MicroBatcher"]

J = TypeVar("J")
R = TypeVar("R")


@dataclass(slots=True)
class _Pending(Generic[J, R]):
    job: J
    size: int
    future: asyncio.Future[R]
    queued_at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Launched(Generic[J, R]):
    """A batch that has run (``results``) or been launched (``collect`` reads it back)."""

    batch: list[_Pending[J, R]]
    t0: float
    results: Sequence[R | BaseException] | None = None
    collect: Callable[[], Awaitable[Sequence[R | BaseException]]] | None = None


@dataclass(slots=True)
class _LoopState(Generic[J, R]):
    queue: deque[_Pending[J, R]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    callers: int = 0  # jobs active around the last run (see the module docstring)
    last_run_s: float = 0.0


class MicroBatcher(Generic[J, R]):
    """Batch jobs of concurrent callers (see module docstring)."""

    def __init__(
        self,
        run: Callable[[list[J]], Awaitable[Sequence[R | BaseException]]],
        *,
        max_wait_s: float,
        max_size: int,
        rejoin_fraction: float = 0.1,
        max_rejoin_s: float = 0.5,
        name: str = "engine",
        launch: Callable[[list[J]], Awaitable[Callable[[], Awaitable[Sequence[R | BaseException]]]]]
        | None = None,
    ) -> None:
        if max_wait_s < 0 or max_size < 1:
            raise ValueError(
                f"need max_wait_s >= 0 and max_size >= 1, got {max_wait_s}, {max_size}"
            )
        if rejoin_fraction < 0 or max_rejoin_s < 0:
            raise ValueError(
                f"need rejoin_fraction >= 0 and max_rejoin_s >= 0, got {rejoin_fraction}, "
                f"{max_rejoin_s}"
            )
        self._run = run
        # Overlap (see the module docstring): ``launch`` starts a batch and returns how to
        # read its results back; None: ``run`` runs each batch to its results.
        self._launch = launch
        self.max_wait_s = max_wait_s
        self.max_size = max_size
        self.rejoin_fraction = rejoin_fraction
        self.max_rejoin_s = max_rejoin_s
        self.name = name  # the metrics' batcher label
        self.batch_sizes: list[int] = []  # jobs per run, for tests and benchmarks
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState[J, R]] = (
            weakref.WeakKeyDictionary()
        )

    async def submit(self, job: J, size: int = 1) -> R:
        """Queue ``job`` (``size`` units of work) and wait for its own result."""
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = _LoopState()
        item: _Pending[J, R] = _Pending(job, max(1, size), loop.create_future())
        state.queue.append(item)
        ENGINE_REQUESTS_WAITING.labels(self.name).set(self._jobs(state))
        state.arrived.set()
        if state.task is None or state.task.done():
            state.task = loop.create_task(self._drain(state))
        return await item.future

    def _take(self, state: _LoopState[J, R]) -> list[_Pending[J, R]]:
        batch: list[_Pending[J, R]] = []
        total = 0
        queue = state.queue
        while queue:
            item = queue[0]
            if item.future.done():  # cancelled while waiting
                queue.popleft()
                continue
            if batch and total + item.size > self.max_size:
                break
            batch.append(queue.popleft())
            total += item.size
        return batch

    def _queued(self, state: _LoopState[J, R]) -> int:
        return sum(p.size for p in state.queue if not p.future.done())

    def _jobs(self, state: _LoopState[J, R]) -> int:
        return sum(not p.future.done() for p in state.queue)

    async def _gather(self, state: _LoopState[J, R]) -> None:
        """Wait for the batch to fill: ``max_wait_s``, then for the last run's callers."""
        if self.max_wait_s <= 0 or self._queued(state) >= self.max_size:
            return
        await asyncio.sleep(self.max_wait_s)
        window = min(self.max_rejoin_s, self.rejoin_fraction * state.last_run_s)
        deadline = time.monotonic() + window
        while self._jobs(state) < state.callers and self._queued(state) < self.max_size:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            state.arrived.clear()
            try:
                await asyncio.wait_for(state.arrived.wait(), left)
            except TimeoutError:
                return

    async def _drain(self, state: _LoopState[J, R]) -> None:
        held: _Launched[J, R] | None = None
        try:
            while state.queue or held is not None:
                batch: list[_Pending[J, R]] = []
                if state.queue:
                    if held is None:
                        await self._gather(state)
                    batch = self._take(state)
                    ENGINE_REQUESTS_WAITING.labels(self.name).set(self._jobs(state))
                launched = await self._start(batch) if batch else None
                # With overlap, the batch before is read back only now, after this one was
                # launched behind it.
                if held is not None:
                    await self._finish(state, held)
                held = launched
                if held is not None and not await self._more_coming(state):
                    await self._finish(state, held)
                    held = None
        except BaseException:  # cancelled (loop shutting down): nobody is left waiting
            for item in [*(held.batch if held is not None else []), *state.queue]:
                item.future.cancel()
            raise

    async def _more_coming(self, state: _LoopState[J, R]) -> bool:
        """Whether to launch another batch before reading the last one back: with overlap,
        when jobs wait or arrive while the loop looks once more (an engine process reads
        its socket then)."""
        if self._launch is None:
            return False
        if not self._jobs(state):
            await asyncio.sleep(0)
        return self._jobs(state) > 0

    async def _start(self, batch: list[_Pending[J, R]]) -> _Launched[J, R]:
        """Run (or, with overlap, launch) one batch."""
        self.batch_sizes.append(len(batch))
        ENGINE_REQUESTS_RUNNING.labels(self.name).set(len(batch))
        t0 = time.monotonic()
        BATCH_SIZE.labels(self.name).observe(len(batch))
        waits = QUEUE_WAIT_SECONDS.labels(self.name)
        for item in batch:
            waits.observe(t0 - item.queued_at)
        jobs = [p.job for p in batch]
        try:
            if self._launch is None:
                return _Launched(batch, t0, results=await self._run(jobs))
            return _Launched(batch, t0, collect=await self._launch(jobs))
        except Exception as exc:
            return _Launched(batch, t0, results=[exc] * len(batch))
        except BaseException:
            for item in batch:
                item.future.cancel()
            raise

    async def _finish(self, state: _LoopState[J, R], launched: _Launched[J, R]) -> None:
        """Read a batch's results back and give each job its own."""
        batch = launched.batch
        try:
            results = launched.results
            if results is None and launched.collect is not None:
                results = await launched.collect()
            if results is None or len(results) != len(batch):
                raise RuntimeError(
                    f"the batch runner returned {len(results or [])} results for {len(batch)} jobs"
                )
        except Exception as exc:
            results = [exc] * len(batch)
        finally:
            ENGINE_REQUESTS_RUNNING.labels(self.name).set(0)
        state.last_run_s = time.monotonic() - launched.t0
        state.callers = len(batch) + self._jobs(state)
        for item, res in zip(batch, results, strict=True):
            if item.future.done():
                continue
            if isinstance(res, BaseException):
                item.future.set_exception(res)
            else:
                item.future.set_result(res)
