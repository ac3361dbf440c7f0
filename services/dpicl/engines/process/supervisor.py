"""The engine process, supervised: started again when it dies, as any engine core is
(DESIGN.md section 3; issue 47: a SIGKILLed engine process left the server answering 503 for
good while ``/livez`` said 200, an outage that needed a person).

:class:`SupervisedEngine` is the :class:`~dpicl.engines.base.Engine` the server holds. It
hands every call to the current :class:`~dpicl.engines.process.engine.ProcessEngine`. When
that process exits (a signal, the kernel's OOM killer, a crash in native code) its reader
thread says so; the calls in flight then fail with
:class:`~dpicl.errors.EngineError` as before (503 ``engine_unavailable``, refunded by the
pipelines: their output was never seen) and a supervisor thread starts a new engine process
after a backoff: ``DPICL_ENGINE_RESTART_BACKOFF_S`` at first, doubled after each restart
that fails, up to ``DPICL_ENGINE_RESTART_BACKOFF_MAX_S``; a restart that succeeds resets it.
Meanwhile calls are refused at once, ``/readyz`` says 503 and ``Retry-After`` says when the
engine is expected back (:meth:`SupervisedEngine.retry_after_s`). ``/livez`` fails only once
``DPICL_ENGINE_RESTART_FAILURES_LIVE`` restarts in a row have failed
(:meth:`SupervisedEngine.not_alive`): a model that no longer loads here is for the
orchestrator to cure with a new pod, not for this process to retry forever unnoticed.

``dpicl_engine_restarts_total{reason, outcome}`` counts restarts by why the process had
stopped (``signal SIGKILL``, ``exit code 1``) and how the restart went (``ok``,
``failed``); ``dpicl_engine_up`` is 1 while the engine answers.

A standby (``spawn``): an engine process started ahead of need that has imported torch and
transformers and waits for its spec. A start of the bundled model's engine process took 36 s
on a loaded 2-core machine, 25 of them importing; from a standby only the model's load is
left. The supervisor keeps one from the first start on, uses it for a restart, and spawns
the next once the engine is back.

A thread, not a task of the event loop: starting an engine process blocks for as long as the
model takes to load (seconds), and the death is noticed on the reader thread anyway.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dpicl.engines.base import FloatArray, GenerationParams, PromptSpec
from dpicl.engines.process.engine import ProcessDecodingSession, ProcessEngine, Standby
from dpicl.errors import EngineError
from dpicl.metrics import ENGINE_RESTARTS, ENGINE_UP

__all__ = ["RestartPolicy", "SupervisedEngine"]

log = logging.getLogger("dpicl.engines")


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How the supervisor restarts (the ``DPICL_ENGINE_RESTART_*`` settings)."""

    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    failures_live: int = 5

    def backoff(self, failures: int) -> float:
        """The wait before the restart that follows ``failures`` failed ones in a row."""
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** min(failures, 30))


class SupervisedEngine:
    """A :class:`ProcessEngine` started again whenever its process dies (module docstring).

    Every attribute it does not define is the current engine's (``name``, ``model``,
    ``engine_pid``, ``threads``, ...): ``/readyz`` shows the running process's."""

    def __init__(
        self,
        start: Callable[..., ProcessEngine],
        policy: RestartPolicy,
        *,
        spawn: Callable[[], Standby] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``start`` builds a new engine process and waits until it is ready (blocking;
        raises :class:`EngineError` when it cannot); the first is started here. With
        ``spawn``, a standby is kept (module docstring) and handed to ``start`` as
        ``standby=``."""
        self._start = start
        self._spawn = spawn
        self._standby: Standby | None = None
        self.policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._down: str | None = None  # why the engine is down, while it is
        self._failures = 0  # failed restarts in a row
        self._restarts = 0  # successful restarts
        self._next_attempt: float | None = None  # clock time of the next restart attempt
        self._last_error: str | None = None
        t0 = clock()
        self._current = self._watch(start())
        #: How long a start takes here (the model's load): part of the expected downtime.
        self._start_s = clock() - t0
        self._thread: threading.Thread | None = None
        self._new_standby()
        ENGINE_UP.set(1)

    # ------------------------------------------------------------------ delegation

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not found on this object: the current engine's.
        current = self.__dict__.get("_current")
        if current is None:
            raise AttributeError(name)
        return getattr(current, name)

    @property
    def current(self) -> ProcessEngine:
        return self._current

    @property
    def restarts(self) -> int:
        """Successful restarts so far."""
        return self._restarts

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        return await self._engine().score_labels(prompts, labels)

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        return await self._engine().generate(prompts, params)

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> ProcessDecodingSession:
        return await self._engine().open_decoding(
            prompts, zero_shot_index=zero_shot_index, top_k=top_k
        )

    def _engine(self) -> ProcessEngine:
        down = self._down
        if down is not None:
            raise EngineError(
                f"the engine process is restarting ({down}); nothing was charged",
                retry_after_s=math.ceil(self.retry_after_s()),
            )
        return self._current

    # ------------------------------------------------------------------ health

    def is_ready(self) -> bool:
        """Whether an engine process is up and answering (``/readyz``)."""
        return self._down is None and not self._closed and self._current.is_ready()

    def not_alive(self) -> str | None:
        """Why this server should be replaced (``/livez`` fails), or None: the restarts
        have failed ``failures_live`` times in a row."""
        with self._lock:
            if self._failures < self.policy.failures_live:
                return None
            return (
                f"the engine process has failed to restart {self._failures} times in a row "
                f"(last: {self._last_error}); this server cannot answer until it is replaced"
            )

    def retry_after_s(self) -> float:
        """Seconds until the engine is expected to answer again: the backoff left before the
        next restart plus the time a start takes here; 0 while it is up."""
        with self._lock:
            if self._down is None:
                return 0.0
            wait = 0.0 if self._next_attempt is None else self._next_attempt - self._clock()
            return max(0.0, wait) + self._start_s

    # ------------------------------------------------------------------ supervision

    def _new_standby(self) -> None:
        if self._spawn is None:
            return
        try:
            standby = self._spawn()
        except OSError as exc:  # no standby: a restart then starts from scratch
            log.warning("cannot start a standby engine process: %s", exc)
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._standby = standby
        if closed:
            standby.kill()

    def _start_engine(self) -> ProcessEngine:
        if self._spawn is None:
            return self._start()
        with self._lock:
            standby, self._standby = self._standby, None
        return self._start(standby=standby)

    def _watch(self, engine: ProcessEngine) -> ProcessEngine:
        engine.on_exit = self._died
        return engine

    def _died(self, engine: ProcessEngine, why: str) -> None:
        """The reader thread of ``engine`` saw its process end (not by :meth:`aclose`)."""
        with self._lock:
            if self._closed or engine is not self._current or self._down is not None:
                return
            self._down = why
            self._next_attempt = self._clock() + self.policy.backoff(0)
            ENGINE_UP.set(0)
            self._thread = threading.Thread(
                target=self._restart_loop, args=(why,), name="engine-supervisor", daemon=True
            )
            self._thread.start()
        log.error("the engine process %d stopped (%s); restarting it", engine.engine_pid, why)

    def _restart_loop(self, why: str) -> None:
        died_at = self._clock()
        while True:
            with self._lock:
                if self._closed:
                    return
                wait = (self._next_attempt or 0.0) - self._clock()
            if wait > 0:
                time.sleep(wait)
            with self._lock:
                if self._closed:
                    return
            t0 = self._clock()
            try:
                engine = self._start_engine()
            except Exception as exc:
                message = exc.message if isinstance(exc, EngineError) else type(exc).__name__
                ENGINE_RESTARTS.labels(why, "failed").inc()
                with self._lock:
                    self._failures += 1
                    self._last_error = message
                    self._next_attempt = self._clock() + self.policy.backoff(self._failures)
                    failures = self._failures
                log.error(
                    "restart %d of the engine process failed: %s (next in %.1f s)",
                    failures,
                    message,
                    self.policy.backoff(failures),
                )
                continue
            with self._lock:
                if self._closed:
                    closing = engine
                else:
                    closing = None
                    self._current = self._watch(engine)
                    self._start_s = self._clock() - t0
                    self._down = None
                    self._next_attempt = None
                    self._failures = 0
                    self._restarts += 1
            if closing is not None:  # closed while it started: it serves nobody
                closing.kill()
                return
            ENGINE_RESTARTS.labels(why, "ok").inc()
            ENGINE_UP.set(1)
            log.warning(
                "the engine process is back (pid %d, %.1f s after it stopped; its start "
                "took %.1f s)",
                engine.engine_pid,
                self._clock() - died_at,
                self._start_s,
            )
            self._new_standby()  # for the next restart
            return

    async def aclose(self) -> None:
        with self._lock:
            self._closed = True
            standby, self._standby = self._standby, None
        ENGINE_UP.set(0)
        if standby is not None:
            standby.kill()
        await self._current.aclose()
