"""The engine process: ``python -m dpicl.engines.process.main FD``.

Started by :meth:`dpicl.engines.process.engine.ProcessEngine.start` with the server's interpreter
and environment and one end of a socket pair as ``FD``. It reads an
:class:`~dpicl.engines.process.wire.EngineSpec`, builds that engine (a failure is sent back as the
engine's own error), answers ``("ready", EngineInfo)`` and then serves requests until the
socket closes (the server closed the engine or died): then it exits.

The model runs in the event loop's own thread (``ModelRunner.inline``), so this process has
one busy Python thread and the model never waits for the interpreter lock; requests that
arrive while a batch runs wait in the socket and are read together when it ends, so the
micro-batcher merges them into the next batch.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from dpicl.engines.base import DecodingSession, Engine
from dpicl.engines.factory import build_from
from dpicl.engines.memory import device_memory
from dpicl.engines.oracle.engine import decode_oracle_tokens
from dpicl.engines.process.wire import (
    CANCEL,
    EngineInfo,
    EngineSpec,
    Observation,
    TokenizerDecoder,
    wire_error,
)
from dpicl.engines.transformers import batching, prefix_cache
from dpicl.errors import EngineError
from dpicl.logging_setup import configure_logging, level_of

__all__ = ["main"]


class _Relay:
    """A stand-in for one of :mod:`dpicl.metrics`' metrics here: observations are kept and
    sent with the next answer, and the server process records them in its own."""

    def __init__(self, name: str, sink: list[Observation], labels: tuple[str, ...] = ()):
        self.name, self.sink, self.labels_ = name, sink, labels

    def labels(self, *values: str) -> _Relay:
        return _Relay(self.name, self.sink, tuple(values))

    def observe(self, value: float) -> None:
        self.sink.append((self.name, self.labels_, "observe", float(value)))

    def inc(self, value: float = 1.0) -> None:
        self.sink.append((self.name, self.labels_, "inc", float(value)))

    def set(self, value: float) -> None:
        self.sink.append((self.name, self.labels_, "set", float(value)))


#: The metrics the engine's own code observes, by module (see :class:`_Relay`).
_RELAYED = {
    batching: (
        "BATCH_SIZE",
        "QUEUE_WAIT_SECONDS",
        "ENGINE_REQUESTS_WAITING",
        "ENGINE_REQUESTS_RUNNING",
    ),
    prefix_cache: (
        "PREFIX_CACHE_HITS",
        "PREFIX_CACHE_MISSES",
        "PREFIX_CACHE_SIZE_BYTES",
        "PREFIX_CACHE_ENTRIES",
        "PREFIX_CACHE_LIMIT_BYTES",
    ),
}


def _relay_metrics(sink: list[Observation]) -> None:
    for module, names in _RELAYED.items():
        for name in names:
            setattr(module, name, _Relay(name, sink))


def _info(engine: Engine, spec: EngineSpec) -> EngineInfo:
    tokenizer = getattr(engine, "tokenizer", None)
    decoder: Callable[[Sequence[int]], str] = (
        TokenizerDecoder(tokenizer) if tokenizer is not None else decode_oracle_tokens
    )
    return EngineInfo(
        name=engine.name,
        model=engine.model,
        is_simulator=engine.is_simulator,
        # An engine without a device (the oracle) runs on the CPU where DPICL_DEVICE=auto.
        device=str(getattr(engine, "device", "cpu" if spec.device == "auto" else spec.device)),
        dtype=getattr(engine, "dtype", None),
        load_format=str(getattr(engine, "load_format", spec.load_format)),
        threads=getattr(engine, "threads", None),
        pid=os.getpid(),
        prefix_cache_mib=getattr(getattr(engine, "tuning", None), "prefix_cache_mib", None),
        decoder=decoder,
        encoder=getattr(engine, "encoder", None) if hasattr(engine, "score_encoded") else None,
    )


class _Server:
    """Answers the server process's requests with one engine."""

    def __init__(self, engine: Engine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.sessions: dict[int, DecodingSession] = {}
        self.next_sid = 1
        self.sink: list[Observation] = []
        self.device = str(getattr(engine, "device", "cpu"))
        self.memory_read_at = float("-inf")
        self.ops: dict[str, Callable[..., Awaitable[Any]]] = {
            "score": engine.score_labels,
            "generate": engine.generate,
            # Prompts tokenised in the server process (an engine with an encoder).
            "score_ids": getattr(engine, "score_encoded", self._unsupported),
            "generate_ids": getattr(engine, "generate_encoded", self._unsupported),
            "open": self._open,
            "step": self._step,
            "advance": self._advance,
            "close": self._close,
        }
        self.done = asyncio.Event()
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def _unsupported(self, *args: Any) -> Any:
        raise EngineError(f"the {self.engine.name} engine takes no token ids")

    async def _open(self, prompts: Any, zero_shot_index: int, top_k: int) -> tuple[int, int]:
        session = await self.engine.open_decoding(
            prompts, zero_shot_index=zero_shot_index, top_k=top_k
        )
        sid, self.next_sid = self.next_sid, self.next_sid + 1
        self.sessions[sid] = session
        return sid, int(session.eos_token_id)

    async def _step(self, sid: int) -> tuple[Any, Any]:
        step = await self.sessions[sid].step()
        return step.top_ids, step.logits

    async def _advance(self, sid: int, token_id: int) -> None:
        await self.sessions[sid].advance(token_id)

    async def _close(self, sid: int) -> None:
        session = self.sessions.pop(sid, None)
        if session is not None:
            await session.aclose()

    def _sample_memory(self) -> None:
        # At most once a second: a reply every millisecond need not read /proc each time.
        now = time.monotonic()
        if now - self.memory_read_at < 1.0:
            return
        self.memory_read_at = now
        for device, kind, value in device_memory(self.device):
            self.sink.append(("DEVICE_MEMORY_BYTES", (device, kind), "set", value))

    def _reply(self, message: tuple[Any, ...]) -> None:
        self._sample_memory()
        observations, self.sink[:] = list(self.sink), []
        try:
            self.conn.send((*message, observations))
        except (OSError, ValueError):
            self.done.set()  # the server process is gone

    async def _handle(self, req_id: int, op: str, args: tuple[Any, ...]) -> None:
        try:
            value = await self.ops[op](*args)
        except Exception as exc:
            self._reply((req_id, False, wire_error(exc)))
        else:
            self._reply((req_id, True, value))

    def _forget(self, req_id: int, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(req_id, None)

    def on_readable(self) -> None:
        try:
            while self.conn.poll():
                req_id, op, args = self.conn.recv()
                if op == CANCEL:
                    # Its client left: a job still waiting for a batch is dropped (the
                    # micro-batcher skips cancelled jobs); one in a running batch finishes.
                    task = self.tasks.get(req_id)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.get_running_loop().create_task(self._handle(req_id, op, args))
                self.tasks[req_id] = task
                task.add_done_callback(functools.partial(self._forget, req_id))
        except (EOFError, OSError):
            self.done.set()

    async def serve(self) -> None:
        _relay_metrics(self.sink)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self.on_readable)
        try:
            await self.done.wait()
        finally:
            loop.remove_reader(self.conn.fileno())
            for task in list(self.tasks.values()):
                task.cancel()
            await self.engine.aclose()


#: What an engine's build imports, imported before its spec arrives (a standby).
_PRELOAD = {"transformers": ("torch", "transformers", "dpicl.engines.transformers.engine")}


def _preload(engine_name: str) -> None:
    """Import ``engine_name``'s modules now: a standby process does while it waits for its
    spec, so that a restart only loads the model (engines/process/engine.py, Standby)."""
    for module in _PRELOAD.get(engine_name, ()):
        try:
            importlib.import_module(module)
        except Exception:  # the build reports it, with the engine's own message
            return


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    conn = Connection(int(args[0]))
    if len(args) > 1:
        _preload(args[1])
    try:
        spec: EngineSpec = conn.recv()
    except (EOFError, OSError):
        return 0  # a standby nobody needed: the server closed it or is gone
    configure_logging(level_of(spec.log_level), spec.log_format)  # type: ignore[arg-type]
    try:
        engine = build_from(spec)
    except Exception as exc:
        conn.send(("failed", wire_error(exc)))
        return 1
    if hasattr(engine, "inline"):
        engine.inline = True
    conn.send(("ready", _info(engine, spec)))
    asyncio.run(_Server(engine, conn).serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
