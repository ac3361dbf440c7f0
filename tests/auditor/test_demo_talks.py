"""The demo talks (issue 45): a phase prints a line at least every 15 s, through awaits and
synchronous waits alike; its messages agree with what runs; the real model's runs leave the
minutes-long client-parameter sweep out; and the command it suggests runs from where it is."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from dpicl_audit.demo import talk
from dpicl_audit.demo.audits import MODEL_PROBES, Counts
from dpicl_audit.demo.main import _cli_command
from dpicl_audit.demo.talk import heartbeat, stopped_message, trials_message


def _lines(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, str]]:
    said: list[tuple[float, str]] = []
    monkeypatch.setattr(talk, "say", lambda t0, text: said.append((time.monotonic(), text)))
    return said


def test_heartbeat_speaks_through_a_blocking_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    said = _lines(monkeypatch)
    with heartbeat(0.0, "waiting", every=0.1):
        time.sleep(0.55)  # a synchronous wait: the event loop could not have printed
    n = len(said)
    assert 2 <= n <= 6, said  # about 5; the bounds leave room for a loaded machine
    assert all(text.startswith("waiting: still running (") for _, text in said)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(said)]
    assert max(gaps) < 0.4
    time.sleep(0.3)
    assert len(said) == n  # silent once the phase is over


def test_heartbeat_speaks_through_an_await(monkeypatch: pytest.MonkeyPatch) -> None:
    said = _lines(monkeypatch)

    async def phase() -> None:
        with heartbeat(0.0, "run", every=0.05):
            await asyncio.sleep(0.22)

    asyncio.run(phase())
    assert len(said) >= 3


def test_the_default_beat_is_under_15_seconds() -> None:
    assert talk.HEARTBEAT_S <= 15.0 / 1.4  # one late line on a loaded machine still fits


def test_messages_agree_with_what_runs() -> None:
    counts = Counts()
    low = trials_message(4.0, 20, 746, 0, 1.5, counts.model_trials_min)
    assert "the least the demo runs" in low and "none fit" in low and "INCONCLUSIVE" in low
    assert "0 fit" not in low
    enough = trials_message(8.0, 200, 150, 400, 0.5, counts.model_trials_min)
    assert "they give it" in enough and "INCONCLUSIVE" not in enough
    short = trials_message(8.0, 120, 300, 120, 0.5, counts.model_trials_min)
    assert "120 fit the time left" in short


def test_the_model_runs_leave_the_parameter_sweep_out() -> None:
    assert "parameters" not in MODEL_PROBES and "ledger" in MODEL_PROBES


def test_the_suggested_command_is_one_that_runs() -> None:
    cmd = _cli_command()
    assert cmd == "dpicl-audit" or cmd.endswith("dpicl-audit") or "-m dpicl_audit.cli" in cmd


def test_a_run_that_logged_every_trial_is_not_stopped_after_all_of_them() -> None:
    done = stopped_message(4.0, 10.0, 20, 20, 1.0)
    assert "logged all 20 trials" in done and "20 of 20" not in done
    assert "after 12 of 20 trials" in stopped_message(4.0, 10.0, 12, 20, 1.0)
