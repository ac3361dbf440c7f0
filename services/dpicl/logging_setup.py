"""The server's log format: one JSON object per line (``DPICL_LOG_FORMAT=json``, for log
collectors) or plain text for a terminal, each line carrying the request id of the request
it was written for (``X-Request-ID``; api/access_log.py sets it).

What the server logs is chosen where it logs (never exemplars, queries, outputs or tokens);
this module only shapes the lines. Only fields the server put in a record on purpose
(``extra=``) are written, so nothing reaches the JSON that its message did not carry.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

__all__ = ["REQUEST_ID", "JsonFormatter", "LogFormat", "configure_logging"]

LogFormat = Literal["json", "text"]

#: The id of the request being served in this task (``-`` outside any request).
REQUEST_ID: ContextVar[str] = ContextVar("dpicl_request_id", default="-")

#: Attributes every LogRecord has; anything else in a record was passed with ``extra=``.
#: ``color_message`` is uvicorn's: its message again, with ANSI colour escapes, which have no
#: place in a log file or a collector's JSON.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


class RequestIdFilter(logging.Filter):
    """Stamp each record with the current request id (``record.request_id``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request id, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            # The type only: an exception's text may quote private data (as api/errors.py).
            out["exception"] = record.exc_info[0].__name__
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``LEVEL logger [request id]: message key=value ...`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}"
            for k, v in record.__dict__.items()
            if k not in _STANDARD and k != "request_id" and not k.startswith("_")
        )
        rid = getattr(record, "request_id", "-")
        line = f"{record.levelname} {record.name} [{rid}]: {record.getMessage()}"
        if record.exc_info and record.exc_info[0] is not None:
            # The type only, as in JSON: an exception's text may quote private data.
            extras = f"{extras} exception={record.exc_info[0].__name__}".strip()
        return f"{line} {extras}" if extras else line


def quiet_progress_bars() -> None:
    """No progress bar on the log stream: loading a model (the embedder, the engine's) draws
    one with ``\r`` on stderr, and a JSON line written meanwhile lands inside it, where a
    line-based collector loses it. The environment variables reach the engine process and
    modules not imported yet; the calls, those imported already."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # huggingface_hub, and transformers
    os.environ["TQDM_DISABLE"] = "1"  # tqdm's own default (sentence-transformers, ...)
    hub = sys.modules.get("huggingface_hub")
    if hub is not None:
        hub.utils.disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def configure_logging(level: int | str, fmt: LogFormat) -> None:
    """Route the root logger (dpicl's and uvicorn's loggers propagate to it) to stderr in
    ``fmt``, replacing any handler a previous call installed. In JSON, nothing else may
    write to that stream: progress bars are turned off (:func:`quiet_progress_bars`)."""
    if fmt == "json":
        quiet_progress_bars()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def level_of(name: str) -> int | str:
    """The logging level of a ``DPICL_LOG_LEVEL`` value: uvicorn's "trace" (5) is below
    logging's DEBUG and has no name there."""
    return 5 if name == "trace" else name.upper()
