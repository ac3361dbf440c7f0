"""Trials: the schedule's missing indices run with bounded concurrency, logged in batches.

:class:`TrialExecutor` runs the indices of a world schedule that the log lacks (so a resumed
run continues exactly), each through its mechanism's :meth:`~dpicl_audit.mechanisms.base.
MechanismAudit.trial`, ``plan.concurrency`` at a time, and writes the records in batches of
``plan.batch_size``, one transaction each (:meth:`dpicl_audit.store.TrialStore.add_trials`,
idempotent). Completed trials are written whatever happens to the others, so a run killed at
any point loses at most the batch in flight and duplicates nothing.

A context that turns out to be spent (``budget_exhausted``: a DPS-MOZO context that answered
a query whose trial never reached the log) is replaced and the trial retried once.

**Every response is an observation** (issue 44): any other 4xx answer to a trial's query, and
one that persists after the retry, is logged as the trial's observation (a refusal:
:func:`~dpicl_audit.estimators.channels.refusal_observation`, with the request's wall time)
instead of ending the run; the estimates test refusals and times for dependence on the world
(:mod:`dpicl_audit.estimators.channels`). Two answers stay errors, as they say nothing of the
private data: 401 (a wrong key) and 404 for a white-box route the server does not have.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import numpy.typing as npt

from dpicl_audit.errors import (
    TargetBudgetExhausted,
    TargetNotFound,
    TargetRejected,
    TargetUnauthorized,
)
from dpicl_audit.estimators.channels import refusal_observation
from dpicl_audit.mechanisms.base import TrialAt
from dpicl_audit.pipeline.progress import ProgressSink
from dpicl_audit.pipeline.run_context import RunContext
from dpicl_audit.store import ContextRecord, TrialRecord

__all__ = ["ContextPick", "TrialExecutor"]

#: ``pick(index, world, spent)``: the context of a trial; ``spent`` names a context that
#: answered ``budget_exhausted`` and must be replaced.
ContextPick = Callable[[int, int, ContextRecord | None], Awaitable[ContextRecord]]


def is_observation(exc: TargetRejected) -> bool:
    """Whether a 4xx answer to a trial is an observation (logged) rather than an error of the
    run's configuration: a wrong key (401), or a white-box route the server does not have
    (404 for a ``/v1/debug/`` path without a ``param``: white-box access is off)."""
    if isinstance(exc, TargetUnauthorized):
        return False
    return not (
        isinstance(exc, TargetNotFound) and exc.path.startswith("/v1/debug/") and not exc.param
    )


class TrialExecutor:
    """Runs and logs the trials of one run."""

    def __init__(self, run: RunContext) -> None:
        self.run_ctx = run
        self._records: list[TrialRecord] = []
        self._lock = asyncio.Lock()
        self._last_flush = time.monotonic()

    def restart_clock(self) -> None:
        self._last_flush = time.monotonic()

    async def flush(self) -> None:
        """Write the buffered records with the wall time since the last write."""
        async with self._lock:
            batch, self._records = self._records, []
            now = time.monotonic()
            wall, self._last_flush = now - self._last_flush, now
            if not batch and wall <= 0:
                return
            write = asyncio.ensure_future(
                asyncio.to_thread(
                    self.run_ctx.store.add_trials,
                    self.run_ctx.run_id,
                    batch,
                    wall_time_s=wall,
                    llm_calls_per_trial=self.run_ctx.mechanism.calls_per_query(self.run_ctx.plan),
                )
            )
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # A worker cancelled mid-write (another trial failed): the thread writes on
                # regardless, so hold the lock until it has. Otherwise the run's last flush
                # (and a resume reading the log) could run before these records are in it.
                await asyncio.wait([write])
                raise

    async def _one(
        self,
        setting: str,
        epsilon: float | None,
        index: int,
        world: int,
        pick: ContextPick,
        *,
        white: bool,
        need_clean: bool,
    ) -> TrialRecord:
        context = await pick(index, world, None)
        for attempt in (0, 1):
            at = TrialAt(setting, epsilon, index, world, context, white, need_clean)
            t0 = time.perf_counter()
            try:
                return await self.run_ctx.mechanism.trial(
                    self.run_ctx.target, self.run_ctx.design, self.run_ctx.plan, at
                )
            except TargetBudgetExhausted as exc:
                replaceable = self.run_ctx.mechanism.queries_per_context(self.run_ctx.plan)
                if attempt or replaceable is None:
                    return self._refused(at, exc, time.perf_counter() - t0)
                context = await pick(index, world, context)
            except TargetRejected as exc:
                if not is_observation(exc):
                    raise
                return self._refused(at, exc, time.perf_counter() - t0)
        raise AssertionError("unreachable")

    def _refused(self, at: TrialAt, exc: TargetRejected, latency: float) -> TrialRecord:
        """A refused trial's record: the refusal is its observation; no decision or score."""
        design = self.run_ctx.design
        query_of = getattr(design, "query_of", None)
        query = query_of(at.index) if callable(query_of) else str(getattr(design, "query", ""))
        return TrialRecord(
            setting=at.setting,
            trial_index=at.index,
            world=at.world,
            context_id=at.context.context_id,
            query=str(query),
            observation=refusal_observation(exc),
            decision=None,
            latency_s=latency,
            epsilon=at.epsilon,
            score=None,
        )

    async def run(
        self,
        setting: str,
        epsilon: float | None,
        worlds: npt.NDArray[np.int8],
        pick: ContextPick,
        *,
        white: bool,
        need_clean: bool = False,
        progress: ProgressSink,
        description: str,
    ) -> None:
        """Run the indices of ``worlds`` that the log lacks, with bounded concurrency."""
        done = self.run_ctx.store.trial_indices(self.run_ctx.run_id, setting)
        missing = [i for i in range(len(worlds)) if i not in done]
        task = progress.add_task(description, total=len(worlds), completed=len(done))
        if not missing:
            return
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in missing:
            queue.put_nowait(i)
        batch = self.run_ctx.plan.batch_size

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                rec = await self._one(
                    setting, epsilon, i, int(worlds[i]), pick, white=white, need_clean=need_clean
                )
                self._records.append(rec)
                progress.advance(task)
                if len(self._records) >= batch:
                    await self.flush()

        n_workers = min(self.run_ctx.plan.concurrency, len(missing))
        workers = [asyncio.create_task(worker()) for _ in range(n_workers)]
        try:
            finished, pending = await asyncio.wait(workers, return_when=asyncio.FIRST_EXCEPTION)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for t in finished:
                exc = t.exception()
                if exc is not None:
                    raise exc
        finally:
            # Ctrl-C (or any error) cancels this coroutine mid-wait: stop every worker and
            # collect its outcome, so none is left running or dies later with "Task
            # exception was never retrieved".
            for t in workers:
                t.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            # Completed trials are kept whatever happened to the others.
            await asyncio.shield(self.flush())
