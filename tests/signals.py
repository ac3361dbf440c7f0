"""Signals to a command in a subprocess as a terminal sends them.

A process started with SIGINT ignored passes that on to every process it starts: a shell
without job control ignores SIGINT in its background jobs (``make test-long &`` in a script,
a CI step run that way), and Python then leaves it ignored rather than raising
KeyboardInterrupt, so asyncio never sees a Ctrl-C either. A test that sends SIGINT to a
``dpicl-audit`` process measured that once as "ran to the end and exited 0" (the Ctrl-C
tests, twice in CI): the command was never told. :func:`ctrl_c_reaches` gives the child the
default disposition, which a foreground process at a terminal has, whatever this process's.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ctrl_c_reaches", "ignoring_ctrl_c"]


def ctrl_c_reaches() -> None:
    """``preexec_fn`` of a command that a test stops with SIGINT: the signal's default
    disposition in the child (Python then installs its KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def ignoring_ctrl_c() -> Iterator[None]:
    """This process with SIGINT ignored, as a background job of a script starts: what a
    child started here inherits unless it is given :func:`ctrl_c_reaches`. Only in the main
    thread (where signal handlers can be set); elsewhere a no-op."""
    try:
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
