"""The engine in a process of its own: :class:`ProcessEngine`, an
:class:`~dpicl.engines.base.Engine` that hands every call to an engine process and awaits
its answer.

Why. torch releases the interpreter lock (the GIL) around every operation and must take it
back before the next; a thread of the same process that runs Python meanwhile (the event
loop serving HTTP, the ledger, the DP maths) holds it for up to the interpreter's switch
interval each time. On an H200 one busy Python thread beside the engine cut it from 830 to
under 8 LLM calls/s, and on a 2-core CPU a toy model from 847 to 20 (issue 36): the GIL
convoy. vLLM moved its engine core into a process of its own for this reason, and so does
dpicl (DESIGN.md section 3): the server process keeps HTTP, the ledger and the DP maths and
exchanges prompts and scores with the engine process, which runs nothing but the model.

How. The engine process (:mod:`dpicl.engines.process.main`, started with the server's own
interpreter and environment) builds the engine from an :class:`EngineSpec` and answers
requests over a socket pair: ``(id, op, args)`` in, ``(id, ok, value, metrics)`` out,
pickled (prompts as token ids and labels' token ids in, for an engine that tokenises: they
are rendered and tokenised here, each prefix once, so the engine process's one thread only
runs the model (issue 46); score arrays, texts and DPS-MOZO step logits out). There
it runs the model in its event loop's own thread (``ModelRunner.inline``): requests that
arrive during a batch wait in the socket and join the next one, so a batch starts as soon
as the engine is free. Here, a sender thread writes requests (a full socket never blocks
the event loop) and a reader thread resolves each request's future; both spend their time
in system calls, outside the GIL. An error raised there is raised here as the same
:class:`~dpicl.errors.DpiclError` (an over-long prompt is still a 4xx naming it); if the
engine process dies, every pending and later call fails with
:class:`~dpicl.errors.EngineError` (503, nothing charged) and ``/readyz`` says so; the
server's :class:`~dpicl.engines.process.supervisor.SupervisedEngine` hears it
(``on_exit``) and starts a new engine process.

Abandoned work (issue 47). A call whose caller is cancelled (its client left) sends
``cancel`` for it: the engine process cancels its task, and a job still waiting in a
micro-batcher is dropped before its batch runs (a batch already running finishes). A
label-scoring call of more than ``chunk_prompts`` prompts (a voting answer of T = 40
partitions) is sent as chunks of that many, one after another, so a cancelled answer stops
after the chunk in flight instead of computing all T.

What the engine process observes for ``/metrics`` (batch sizes, queue waits, prefix-cache
hits) travels back with the answers and is recorded in this process's metrics
(:mod:`dpicl.metrics`).

Only in-process state is lost across the boundary: the engine's Python object. Nothing
private crosses it that did not before (the prompts, which the engine saw anyway).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from dpicl import metrics
from dpicl.engines.base import FloatArray, GenerationParams, PromptSpec, StepLogits
from dpicl.engines.process.wire import (
    CANCEL,
    EngineInfo,
    EngineSpec,
    Observation,
    error_of,
)
from dpicl.engines.prompting import PromptTokenizer
from dpicl.errors import EngineError

__all__ = [
    "ProcessDecodingSession",
    "ProcessEngine",
    "Standby",
    "spawn",
]

log = logging.getLogger("dpicl.engines")


def exit_reason(code: int | None) -> str:
    """Why a process ended, for a metric's label: ``signal SIGKILL`` or ``exit code 1``."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def record(observations: Sequence[Observation]) -> None:
    """Record the engine process's metric observations in this process's metrics."""
    for name, labels, kind, value in observations:
        metric: Any = getattr(metrics, name, None)
        if metric is None:
            continue
        if labels:
            metric = metric.labels(*labels)
        if kind == "inc":
            metric.inc(value)
        elif kind == "set":
            metric.set(value)
        else:
            metric.observe(value)


@dataclass(frozen=True, slots=True)
class Standby:
    """An engine process started ahead of need (:func:`spawn`): it has imported its
    engine's modules (torch and transformers: most of a start on a CPU, about 25 s of 36 on a
    loaded 2-core machine) and waits for its :class:`EngineSpec`. The supervisor keeps one,
    so that a restart only loads the model (issue 47)."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """End it (a standby nobody will use); it also ends by itself when its socket
        closes, as when the server process dies."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def spawn(engine_name: str, env: dict[str, str] | None = None) -> Standby:
    """Start an engine process that imports ``engine_name``'s modules and waits for its
    spec (:meth:`ProcessEngine.start` sends it). Returns at once."""
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dpicl.engines.process.main",
                str(theirs.fileno()),
                engine_name,
            ],
            pass_fds=(theirs.fileno(),),
            env=env if env is not None else os.environ.copy(),
            # Its own process group: a Ctrl-C at the terminal reaches the server, which
            # then closes the engine in order (aclose), not both at once.
            start_new_session=True,
        )
    finally:
        theirs.close()
    return Standby(proc, ours)


class ProcessEngine:
    """An :class:`~dpicl.engines.base.Engine` whose model runs in an engine process (see
    the module docstring). Build it with :meth:`start`."""

    #: Its device memory is read in the engine process and relayed (not read at a scrape).
    relays_metrics = True

    def __init__(
        self,
        sock: socket.socket,
        conn: Connection,
        proc: subprocess.Popen[bytes],
        info: EngineInfo,
    ) -> None:
        self._sock = sock  # kept to shut the socket down: see _send
        self._conn = conn
        self._proc = proc
        self.info = info
        self.name = info.name
        self.model = info.model
        self.is_simulator = info.is_simulator
        self.threads = info.threads
        self.dtype = info.dtype
        self.load_format = info.load_format
        self.device = info.device
        self.engine_pid = info.pid
        self.prefix_cache_mib = info.prefix_cache_mib
        # Used only on the event loop (score_labels, generate): one thread, as it needs.
        self.tokens = (
            PromptTokenizer.from_encoder(info.encoder) if info.encoder is not None else None
        )
        self._calls = itertools.count()
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        self._lock = threading.Lock()
        self._dead: str | None = None
        self._closed = False
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: Prompts per label-scoring call sent to the engine process (0: all in one call).
        self.chunk_prompts = 0
        #: Called (engine, why) from the reader thread when the process ends unasked.
        self.on_exit: Callable[[ProcessEngine, str], None] | None = None
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._sender = threading.Thread(target=self._send, name="engine-sender", daemon=True)
        self._reader.start()
        self._sender.start()

    # ------------------------------------------------------------------ life

    @classmethod
    def start(
        cls,
        spec: EngineSpec,
        *,
        env: dict[str, str] | None = None,
        chunk_prompts: int = 0,
        standby: Standby | None = None,
    ) -> ProcessEngine:
        """Start the engine process, build ``spec`` there and wait until it is ready.
        Blocking (model loading): call it before serving, or in a thread. Raises the
        engine's own :class:`~dpicl.errors.EngineError` if it cannot be built.
        ``standby``: a process :func:`spawn` started ahead of need, used if still alive
        (its imports are done: only the model's load is left)."""
        if standby is None or not standby.alive():
            if standby is not None:
                standby.kill()
            standby = spawn(spec.name, env)
        proc, ours = standby.proc, standby.sock
        conn = Connection(os.dup(ours.fileno()))
        try:
            conn.send(spec)
            status, value = conn.recv()
        except (EOFError, OSError) as exc:
            code = proc.wait()
            conn.close()
            ours.close()
            raise EngineError(
                f"the engine process exited with code {code} before it was ready"
            ) from exc
        if status != "ready":
            proc.wait()
            conn.close()
            ours.close()
            raise error_of(value)
        engine = cls(ours, conn, proc, value)
        engine.chunk_prompts = chunk_prompts
        log.info(
            "engine process %d serves %s (%s, dtype %s) on %s%s",
            value.pid,
            value.model,
            value.name,
            value.dtype,
            value.device,
            " (DPICL_DEVICE=auto: chosen automatically)" if spec.device == "auto" else "",
        )
        return engine

    def is_ready(self) -> bool:
        """Whether the engine process is alive and answering (for ``/readyz``)."""
        return self._dead is None and not self._closed and self._proc.poll() is None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._outbox.put(None)  # the sender closes the socket: the engine process ends
        try:
            await asyncio.to_thread(self._proc.wait, 30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a wedged engine
            self._proc.kill()
            await asyncio.to_thread(self._proc.wait)
        self._fail_all("the engine is closed")

    def kill(self) -> None:
        """End the engine process now, from any thread (a supervisor that no longer wants
        an engine it started)."""
        self._closed = True
        self._outbox.put(None)
        with contextlib.suppress(OSError):
            self._proc.kill()

    def __del__(self) -> None:  # pragma: no cover - interpreter exit without aclose
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    # ------------------------------------------------------------------ transport

    def _send(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                # shutdown, not close: the reader thread is blocked reading this socket, and
                # a close would neither wake it nor let the engine process see the end.
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
                return
            try:
                self._conn.send(item)
            except (OSError, ValueError) as exc:
                self._fail_all(f"the engine process cannot be reached ({exc})")
                return

    def _read(self) -> None:
        while True:
            try:
                req_id, ok, value, observations = self._conn.recv()
            except (EOFError, OSError, ValueError):
                break
            if observations:
                record(observations)
            with self._lock:
                fut = self._pending.pop(req_id, None)
            if fut is None or fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(error_of(value))
        code = self._proc.wait()
        self._conn.close()
        self._sock.close()
        if self._closed:
            self._fail_all("the engine is closed")
        else:
            why = exit_reason(code)
            log.error("the engine process exited with code %s (%s)", code, why)
            # The supervisor first: the calls failed below are answered 503 with a
            # Retry-After read from it, which must already know the engine is down.
            if self.on_exit is not None:
                try:
                    self.on_exit(self, why)
                except Exception:  # pragma: no cover - never leave the calls hanging
                    log.exception("the engine's exit handler failed")
            self._fail_all(f"the engine process exited with code {code} ({why})")

    def _fail_all(self, why: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = why
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(EngineError(why))

    def submit(self, op: str, *args: Any) -> concurrent.futures.Future[Any]:
        """Send ``op(*args)`` to the engine process; its answer resolves the future."""
        return self._submit(op, args)[1]

    def _submit(self, op: str, args: tuple[Any, ...]) -> tuple[int, concurrent.futures.Future[Any]]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None or self._closed:
                why = "the engine is closed" if self._closed else self._dead
                fut.set_exception(EngineError(why or "the engine is closed"))
                return 0, fut
            req_id = next(self._ids)
            self._pending[req_id] = fut
        self._outbox.put((req_id, op, args))
        return req_id, fut

    async def call(self, op: str, *args: Any) -> Any:
        """``op(*args)`` in the engine process. Cancelling the caller cancels the call there
        too: dropped if it still waits for a batch, finished and discarded if it runs."""
        req_id, fut = self._submit(op, args)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            with self._lock:
                waiting = self._pending.pop(req_id, None) is not None
            if waiting and self._dead is None and not self._closed:
                self._cancel(req_id)
            raise

    def _cancel(self, req_id: int) -> None:
        """Tell the engine process to drop call ``req_id`` (no answer comes back)."""
        self._outbox.put((req_id, CANCEL, ()))

    # ------------------------------------------------------------------ Engine

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        if self.tokens is not None and prompts and labels:
            # Rendered and tokenised here (each prefix once); a prompt that does not fit is
            # refused here, with the engine's own error, without a round trip.
            call = f"call:{next(self._calls)}"
            rows, labs = self.tokens.encode_scoring(prompts, labels, call)
            return await self._chunked(
                len(rows), lambda i, j: self.call("score_ids", rows[i:j], labs[i:j])
            )
        texts, names = list(prompts), list(labels)
        return await self._chunked(len(texts), lambda i, j: self.call("score", texts[i:j], names))

    async def _chunked(
        self, n: int, score: Callable[[int, int], Awaitable[FloatArray]]
    ) -> FloatArray:
        """``score(i, j)`` of rows ``i:j`` over ``n`` rows, in chunks of ``chunk_prompts``,
        one in flight at a time: a cancelled answer stops after the chunk in flight (the
        module docstring). The chunks of concurrent answers still share the engine's
        batches."""
        size = self.chunk_prompts
        if size <= 0 or n <= size:
            return await score(0, n)
        parts = [await score(i, min(i + size, n)) for i in range(0, n, size)]
        return np.concatenate(parts, axis=0)

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        params.check()  # refused here, without a round trip
        if not prompts:
            return []
        result: list[str]
        if self.tokens is not None:
            rows = self.tokens.encode_generation(prompts, f"call:{next(self._calls)}")
            result = await self.call("generate_ids", rows, params)
            return result
        result = await self.call("generate", list(prompts), params)
        return result

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> ProcessDecodingSession:
        sid, eos = await self.call("open", list(prompts), zero_shot_index, top_k)
        return ProcessDecodingSession(self, sid, eos)


class ProcessDecodingSession:
    """A DPS-MOZO decoding session held by the engine process."""

    def __init__(self, engine: ProcessEngine, sid: int, eos_token_id: int) -> None:
        self._engine = engine
        self._sid = sid
        self.eos_token_id = eos_token_id
        self._closed = False

    async def step(self) -> StepLogits:
        top_ids, logits = await self._engine.call("step", self._sid)
        return StepLogits(top_ids=np.asarray(top_ids), logits=np.asarray(logits))

    async def advance(self, token_id: int) -> None:
        await self._engine.call("advance", self._sid, int(token_id))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._engine.info.decoder(token_ids)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Not awaited: the engine process drops the session whenever it reads this.
        self._engine.submit("close", self._sid)
