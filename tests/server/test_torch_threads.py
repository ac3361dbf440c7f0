"""DPICL_TORCH_THREADS: the default is the cores this process may use (affinity, capped by a
cgroup CPU quota), never torch's count of the host's CPUs; settings override it."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpicl.config import Settings
from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.threads import (
    ThreadPlan,
    apply_torch_threads,
    choose_threads,
    set_omp_wait_policy,
    usable_cores,
)
from tests.server.real_model import load_bundled


@pytest.mark.parametrize(
    ("intra", "interop", "cores", "expected"),
    [
        (None, None, 1, (1, 1)),
        (None, None, 2, (2, 1)),
        (None, None, 16, (16, 8)),
        (3, None, 16, (3, 1)),
        (None, 4, 2, (2, 4)),
        (8, 2, 1, (8, 2)),  # an explicit setting wins over the cores
    ],
)
def test_choice(
    intra: int | None, interop: int | None, cores: int, expected: tuple[int, int]
) -> None:
    plan = choose_threads(intra, interop, cores)
    assert (plan.intra, plan.interop) == expected
    assert plan.source == ("DPICL_TORCH_THREADS" if intra else f"usable cores ({cores})")


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="cores must be >= 1, got 0"):
        choose_threads(None, None, 0)
    with pytest.raises(ValueError, match="got 0, 1"):
        ThreadPlan(intra=0, interop=1, source="x")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpu.max"
    path.write_text(text)
    return path


def test_usable_cores_follow_affinity_and_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(tmp_path / "absent") == affinity
    assert usable_cores(write(tmp_path, "max 100000\n")) == affinity
    # A quota of half a CPU still gets a thread; 1.5 CPUs round up to 2 (within affinity).
    assert usable_cores(write(tmp_path, "50000 100000\n")) == 1
    assert usable_cores(write(tmp_path, "150000 100000\n")) == min(2, affinity)
    assert usable_cores(write(tmp_path, "6400000 100000\n")) == affinity
    assert usable_cores(write(tmp_path, "garbage\n")) == affinity


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPICL_TORCH_THREADS", "3")
    monkeypatch.setenv("DPICL_TORCH_INTEROP_THREADS", "2")
    s = Settings()
    assert (s.torch_threads, s.torch_interop_threads) == (3, 2)
    monkeypatch.setenv("DPICL_TORCH_THREADS", "0")
    with pytest.raises(ValueError, match="torch_threads"):
        Settings()


def test_apply_sets_torch_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="dpicl.engines"):
            held = apply_torch_threads(ThreadPlan(intra=1, interop=1, source="test"))
        assert held.intra == torch.get_num_threads() == 1
        # The inter-op pool can be sized only once per process: it reports what holds.
        assert held.interop == torch.get_num_interop_threads()
        assert "torch threads: 1 intra-op" in caplog.text and "(from test)" in caplog.text
    finally:
        torch.set_num_threads(before)


def test_wait_policy_is_set_before_torch_loads() -> None:
    """In a fresh process (torch not loaded), ``passive`` reaches OpenMP's variable; an
    operator's OMP_WAIT_POLICY wins; ``inherit`` leaves the environment as it is."""
    code = (
        "import os, sys\n"
        "from dpicl.engines.threads import set_omp_wait_policy\n"
        "assert 'torch' not in sys.modules\n"
        "print(set_omp_wait_policy(sys.argv[1]), os.environ.get('OMP_WAIT_POLICY', '-'))\n"
    )
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}

    def run(policy: str, **env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, policy],
            env=base | env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()

    assert run("passive") == "PASSIVE PASSIVE"
    assert run("active") == "ACTIVE ACTIVE"
    assert run("inherit") == "-"  # "" and no variable
    assert run("passive", OMP_WAIT_POLICY="active") == "active active"


def test_wait_policy_after_torch_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with caplog.at_level(logging.WARNING, logger="dpicl.engines"):
        assert set_omp_wait_policy("passive") == ""  # torch is loaded in this process
    assert "OMP_WAIT_POLICY" not in os.environ
    assert "too late: torch is already loaded" in caplog.text


@pytest.mark.slow
def test_the_engine_holds_its_thread_count_in_every_worker_thread() -> None:
    """torch's intra-op count is per thread once a thread has run an operator: a worker
    thread that ran the model at 2 threads kept 2 after ``torch.set_num_threads(1)`` in
    another thread (bench/threads.py once compared 2 threads with 2 that way). The engine
    applies its own plan in whichever thread runs the model."""
    before = torch.get_num_threads()
    engine = load_bundled()
    prompts = ["The sky is", "Water is"]

    async def run() -> tuple[set[int], set[int]]:
        engine.threads = ThreadPlan(intra=2, interop=1, source="test")
        seen_two = set()
        for _ in range(4):  # the executor's threads run the model at 2
            await engine.generate(
                [PromptSpec(text=p, query=p) for p in prompts],
                GenerationParams(max_tokens=2, temperature=0.0),
            )
            seen_two.add(await engine.run(torch.get_num_threads))
        torch.set_num_threads(1)  # in this thread only: not what the workers run with
        engine.threads = ThreadPlan(intra=1, interop=1, source="test")
        seen_one = {await engine.run(torch.get_num_threads) for _ in range(8)}
        return seen_two, seen_one

    try:
        seen_two, seen_one = asyncio.run(run())
    finally:
        asyncio.run(engine.aclose())
        torch.set_num_threads(before)
    assert seen_two == {2}
    assert seen_one == {1}
