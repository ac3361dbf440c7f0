"""What crosses the socket pair between the server process and the engine process: the
engine to build (:class:`EngineSpec`), what the engine process reports once built
(:class:`EngineInfo`), the cancel operation, metric observations, and errors as they travel
(:func:`wire_error` there, :func:`error_of` here). Both sides import it; it imports neither."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpicl import errors
from dpicl.engines.prompting import PromptEncoder
from dpicl.engines.threads import ThreadPlan
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import DpiclError, EngineError

__all__ = [
    "CANCEL",
    "EngineInfo",
    "EngineSpec",
    "Observation",
    "TokenizerDecoder",
    "WireError",
    "error_of",
    "wire_error",
]

#: The operation that cancels an earlier call: ``(its id, CANCEL, ())``; it has no answer.
CANCEL = "cancel"

#: One metric observation made in the engine process: (name in dpicl.metrics, label
#: values, "observe" or "inc", value).
Observation = tuple[str, tuple[str, ...], str, float]
#: How an error crosses the boundary: (class name in dpicl.errors, message, param), or
#: ("", description, None) for anything else.
WireError = tuple[str, str, str | None]


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What the engine process builds (:func:`dpicl.engines.factory.build_engine`'s
    arguments for an engine that runs where it is built)."""

    name: str
    model: str | None = None
    cache_dir: Path | None = None
    device: str = "cpu"
    dtype: str = "auto"
    load_format: str = "auto"
    tuning: EngineTuning | None = None
    threads: ThreadPlan | None = None
    log_level: str = "info"
    log_format: str = "text"


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the engine process reports once its engine is built."""

    name: str
    model: str
    is_simulator: bool
    device: str
    dtype: str | None
    load_format: str
    threads: ThreadPlan | None
    pid: int
    prefix_cache_mib: int | None
    #: Detokenises a DPS-MOZO suffix here, as the engine's session would there
    #: (``DecodingSession.decode`` is synchronous: no round trip on the event loop).
    decoder: Callable[[Sequence[int]], str]
    #: The engine's prompt encoder (tokenizer and settings), for an engine that tokenises:
    #: prompts are rendered and tokenised here and cross as token ids (issue 46), so the
    #: engine process's one thread only runs the model. None: prompts cross as they are.
    encoder: PromptEncoder | None = None


class TokenizerDecoder:
    """Detokenises as the transformers engine's decoding session does; it travels from the
    engine process to the server process pickled with its tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))


def wire_error(exc: BaseException) -> WireError:
    """``exc`` as it crosses the boundary (see :func:`raise_wire_error`)."""
    if isinstance(exc, DpiclError) and getattr(errors, type(exc).__name__, None) is type(exc):
        return type(exc).__name__, exc.message, exc.param
    return "", f"{type(exc).__name__}: {exc}", None


def error_of(wire: WireError) -> DpiclError:
    """The error :func:`wire_error` sent: the same DpiclError class, message and param; any
    other exception as an EngineError naming it."""
    name, message, param = wire
    cls = getattr(errors, name, None) if name else None
    if isinstance(cls, type) and issubclass(cls, DpiclError):
        return cls(message, param=param)
    return EngineError(f"the engine process failed: {message}")
