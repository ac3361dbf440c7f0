"""Progress without a terminal: a plain line every few seconds, never silent for minutes."""

from __future__ import annotations

import io

from rich.console import Console

from dpicl_audit.pipeline.progress import LineProgress, open_progress


def test_a_pipe_gets_plain_lines_at_most_every_interval() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    progress = open_progress(console, enabled=True)
    assert isinstance(progress, LineProgress)
    with progress:
        task = progress.add_task("eps=1 black-box", total=10, completed=2)
        for _ in range(8):
            progress.advance(task)
    lines = buf.getvalue().splitlines()
    # the interval (5 s) did not pass: only the completion line
    assert lines == [lines[0]] and lines[0].startswith("eps=1 black-box: 10/10 (")
    assert "ETA" in lines[0]

    buf2 = io.StringIO()
    fast = LineProgress(Console(file=buf2, force_terminal=False, width=200), interval=0.0)
    task = fast.add_task("clean votes", total=3, completed=0)
    for _ in range(3):
        fast.advance(task)
    assert [ln.split(":")[1].split()[0] for ln in buf2.getvalue().splitlines()] == [
        "1/3",
        "2/3",
        "3/3",
    ]


def test_a_terminal_gets_bars_and_off_means_nothing() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    assert not isinstance(open_progress(console, enabled=True), LineProgress)
    quiet = open_progress(Console(file=buf, force_terminal=False), enabled=False)
    with quiet:
        quiet.advance(quiet.add_task("x", total=1, completed=0))
    assert "x" not in buf.getvalue()
