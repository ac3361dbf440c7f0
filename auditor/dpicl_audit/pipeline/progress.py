"""Progress of long work: rich bars on a terminal, a plain line every few seconds elsewhere.

Logs of runs started without a terminal (CI, ``nohup``, a pipe) are not silent for minutes:
:class:`LineProgress` prints ``<task>: <done>/<total> (<rate>/s, <elapsed>, ETA <eta>)`` at
most every ``interval`` seconds and once when a task completes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = ["LineProgress", "ProgressSink", "open_progress"]

LINE_INTERVAL_S = 5.0


class ProgressSink(Protocol):
    """What the trial executor reports to."""

    def add_task(self, description: str, *, total: int, completed: int) -> int: ...

    def advance(self, task: int) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class _RateColumn(ProgressColumn):
    """Trials per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text("-- /s", style="progress.data.speed")
        return Text(f"{speed:,.1f} /s", style="progress.data.speed")


class _RichProgress:
    def __init__(self, console: Console, enabled: bool) -> None:
        self._p = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            _RateColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )

    def add_task(self, description: str, *, total: int, completed: int) -> int:
        return int(self._p.add_task(description, total=total, completed=completed))

    def advance(self, task: int) -> None:
        self._p.advance(task)  # type: ignore[arg-type]

    def __enter__(self) -> Self:
        self._p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._p.__exit__(None, None, None)


@dataclass
class _LineTask:
    description: str
    total: int
    done: int
    start_done: int
    started: float = field(default_factory=time.monotonic)
    last_print: float = field(default_factory=time.monotonic)


class LineProgress:
    """One plain progress line per task every ``interval`` seconds (no terminal needed)."""

    def __init__(self, console: Console, interval: float = LINE_INTERVAL_S) -> None:
        self.console = console
        self.interval = interval
        self.tasks: list[_LineTask] = []

    def add_task(self, description: str, *, total: int, completed: int) -> int:
        self.tasks.append(_LineTask(description, total, completed, completed))
        return len(self.tasks) - 1

    def advance(self, task: int) -> None:
        t = self.tasks[task]
        t.done += 1
        now = time.monotonic()
        if t.done >= t.total or now - t.last_print >= self.interval:
            t.last_print = now
            self.console.print(self.line(t, now), highlight=False, soft_wrap=True)

    @staticmethod
    def line(t: _LineTask, now: float) -> str:
        elapsed = now - t.started
        rate = (t.done - t.start_done) / elapsed if elapsed > 0 else 0.0
        left = t.total - t.done
        eta = f"{left / rate:.0f} s" if rate > 0 else "--"
        return f"{t.description}: {t.done}/{t.total} ({rate:,.1f}/s, {elapsed:.0f} s, ETA {eta})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def open_progress(console: Console, enabled: bool) -> ProgressSink:
    """Rich bars when ``console`` is a terminal, plain lines when it is not, nothing when
    progress is off."""
    if enabled and not console.is_terminal:
        return LineProgress(console)
    return _RichProgress(console, enabled)
