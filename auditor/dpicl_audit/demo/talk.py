"""What the demo says while it runs (issue 45: "three minutes of silence"): a timestamped
line per step (:func:`say`), a "still running" line every :data:`HEARTBEAT_S` seconds of a
long step (:func:`heartbeat`), and what a real run is about to do, in words that agree with
what runs (:func:`trials_message`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from rich.console import Console

__all__ = [
    "HEARTBEAT_S",
    "console",
    "heartbeat",
    "need_text",
    "say",
    "stopped_message",
    "trials_message",
]

console = Console(stderr=True)


def say(t0: float, text: str) -> None:
    console.print(f"[bold cyan][{time.monotonic() - t0:6.1f}s][/bold cyan] {text}")


#: Seconds between two "still running" lines of a phase (issue 45: the demo must print
#: something at least every 15 s; the real model's probes were silent for 3 minutes).
HEARTBEAT_S = 10.0


@contextlib.contextmanager
def heartbeat(t0: float, phase: str, every: float = HEARTBEAT_S) -> Iterator[None]:
    """Print ``phase: still running (N s)`` every ``every`` seconds while the block runs,
    from a thread of its own: it speaks through synchronous waits (a server loading its
    model, the report's plots) as well as through the audits' awaits."""
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            say(t0, f"{phase}: still running ({time.monotonic() - start:.0f} s)")

    thread = threading.Thread(target=beat, name="demo-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def trials_message(
    eps: float, trials: int, need: int | None, fit: int, per_trial: float, minimum: int
) -> str:
    """What the next real run does and why, in words that agree with what runs (issue 45:
    "20 real white-box trials (...; 0 fit the time left)", and then it ran them)."""
    head = f"model: {trials} real white-box trials at epsilon {eps:g}"
    power = f"power needs about {need_text(need)}"
    if trials <= minimum and (need is None or trials < need):
        room = "none fit" if fit < trials else f"{fit} fit"
        return (
            f"{head}, the least the demo runs ({power}; {room} the time left at "
            f"{per_trial:.2f} s a trial): too few for power, so its verdict is INCONCLUSIVE"
        )
    if need is not None and trials >= need:
        return f"{head} ({power}: they give it; {per_trial:.2f} s a trial)"
    return f"{head} ({power}; {fit} fit the time left at {per_trial:.2f} s a trial)"


def stopped_message(eps: float, cap: float, done: int, trials: int, per_trial: float) -> str:
    """What became of a real run the demo stopped at its share of the time: a run that had
    logged every trial was stopped in its estimation and probes, not "after 20 of 20 trials"
    (issue 45)."""
    if done >= trials:
        return (
            f"model: the epsilon {eps:g} run logged all {trials} trials; stopped at "
            f"{cap:.0f} s, its share of the budget, during its estimation and probes; the "
            "report estimates from the logged trials"
        )
    return (
        f"model: stopped the epsilon {eps:g} run at {cap:.0f} s, its share of the budget, "
        f"after {done} of {trials} trials (now {per_trial:.2f} s a trial); the report "
        "estimates from the logged trials"
    )


def need_text(need: int | None) -> str:
    return "no count" if need is None else f"{need:,}"
