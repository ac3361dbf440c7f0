"""How many CPU threads torch may use: DPICL_TORCH_THREADS and DPICL_TORCH_INTEROP_THREADS.

torch's own default is the number of the host's CPUs. In a container or under ``taskset``
the process may use far fewer, and then every matrix product runs more threads than cores:
on a loaded 2-core machine one thread served warm queries x4.5 faster than two (issue 30,
``bench/threads.py``). So the default here is the cores this process may actually use: its
CPU affinity (``os.sched_getaffinity``), capped by a cgroup v2 CPU quota (``cpu.max``, what a
Kubernetes CPU limit sets) where one is readable. The pure choice (:func:`choose_threads`)
is apart from the side effect on torch (:func:`apply_torch_threads`).

OpenMP's wait policy (DPICL_OMP_WAIT_POLICY) matters as much. By default torch's OpenMP
threads spin on a core while they wait for the next parallel region. Where other processes
need those cores (a shared machine, several replicas on one node, a test suite beside the
server) the spinning threads take the cores from the very threads they wait for: ten
partition generations of 16 tokens took 107-114 s with spinning and 5.5-8 s with passive
waiting, on 2 cores at a load average of 10-12 (issue 30). ``dpicl serve`` therefore sets
``OMP_WAIT_POLICY=PASSIVE`` before torch loads, unless the operator set OMP_WAIT_POLICY.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ThreadPlan",
    "apply_torch_threads",
    "choose_threads",
    "set_omp_wait_policy",
    "usable_cores",
]

log = logging.getLogger("dpicl.engines")

#: cgroup v2's CPU quota of this process's group ("max 100000" when there is none).
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def _cgroup_quota(path: Path = CGROUP_CPU_MAX) -> float | None:
    """CPUs' worth of time the cgroup quota allows, or None (no quota, or not readable)."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        q, p = float(quota), float(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on: its affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(cpu_max)
    if quota is not None:
        # A quota of 1.5 CPUs still lets two threads run; rounding down would idle half a core.
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """torch's intra-op and inter-op thread counts, and where they came from."""

    intra: int
    interop: int
    source: str  # "DPICL_TORCH_THREADS" or "usable cores"

    def __post_init__(self) -> None:
        if self.intra < 1 or self.interop < 1:
            raise ValueError(f"thread counts must be >= 1, got {self.intra}, {self.interop}")


def choose_threads(
    intra: int | None, interop: int | None, cores: int, workers: int = 1
) -> ThreadPlan:
    """The threads to use: the settings where given, else this process's share of the
    usable ``cores`` among the server's ``workers`` processes (DPICL_WORKERS; at least 1).

    Inter-op threads run independent operators side by side; a served forward pass is one
    chain of operators, so one inter-op thread per two intra-op ones is plenty (torch's own
    default is the host's CPU count, as many again as the intra-op pool). Every worker
    taking every core would put ``workers`` times as many threads as cores on them.
    """
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    share = max(1, cores // workers)
    chosen = intra if intra is not None else share
    other = interop if interop is not None else max(1, chosen // 2)
    if intra is not None:
        source = "DPICL_TORCH_THREADS"
    elif workers == 1:
        source = f"usable cores ({cores})"
    else:
        source = f"usable cores ({cores}) shared by {workers} workers"
    return ThreadPlan(intra=chosen, interop=other, source=source)


def apply_torch_threads(plan: ThreadPlan) -> ThreadPlan:
    """Set torch's thread pools to ``plan`` (process-wide) and log it; returns what holds.

    torch lets the inter-op pool be sized only before its first parallel work; where that
    already happened (an engine built twice in one process, as in tests) the pool keeps its
    size and the returned plan says so.
    """
    import torch

    torch.set_num_threads(plan.intra)
    interop = plan.interop
    try:
        torch.set_num_interop_threads(plan.interop)
    except RuntimeError:
        interop = torch.get_num_interop_threads()
    held = ThreadPlan(intra=torch.get_num_threads(), interop=interop, source=plan.source)
    log.info(
        "torch threads: %d intra-op, %d inter-op (from %s)", held.intra, held.interop, held.source
    )
    return held


def set_omp_wait_policy(policy: str) -> str:
    """Set ``OMP_WAIT_POLICY`` to ``policy`` (``passive`` or ``active``) for this process,
    unless it is set already (the operator's choice wins) or ``policy`` is ``inherit``;
    returns the policy that holds ("" for OpenMP's own default).

    OpenMP reads the variable once, when torch loads it: call this before torch is
    imported. Where torch is already loaded, nothing changes, and the log says so.
    """
    import sys

    held = os.environ.get("OMP_WAIT_POLICY", "")
    if policy != "inherit" and not held:
        if "torch" in sys.modules:
            log.warning("OMP_WAIT_POLICY=%s comes too late: torch is already loaded", policy)
            return held
        os.environ["OMP_WAIT_POLICY"] = held = policy.upper()
    log.info("OpenMP wait policy: %s", held or "OpenMP's default (spin, then sleep)")
    return held
