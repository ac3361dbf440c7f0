"""Where an engine's time goes under load: ``bench/gpu.py --profile``.

Issue 46 diagnosed the GPU engine by hand (cProfile around every batch, then torch.profiler
on the device); this prints the same split for any engine and concurrency, in two untimed
passes over the same load as the row just measured:

* host (cProfile over the whole load): the wall time, the time inside the engine's batches
  (``ModelRunner.locked``: the engine's one thread holding the model), and within it, or
  outside it, the time spent tokenising and templating (the tokenizer's ``__call__`` and
  ``apply_chat_template``), the time spent reading results back to the host (``.cpu()``,
  ``.item()``, ``.tolist()``, ``.nonzero()``: on CUDA that is where the host waits for the
  device), and the rest of the batches (Python, kernel launches, and on the CPU the kernels
  themselves, which run inside the calls that launch them);
* device (torch.profiler over the same load): the self time of the CUDA kernels (of the
  CPU operators where there is no GPU) by class (matrix products, attention, elementwise
  and copies, other), the kernel launches, and the synchronisations and host reads per
  engine batch (each batch is a ``dpicl::batch`` range, marked in ``ModelRunner.locked``),
  with the host's time spent waiting in them.

Profiling slows the engine (cProfile most): the passes are not timed rows, only shares.
"""

from __future__ import annotations

import cProfile
import pstats
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceSplit", "HostSplit", "kernel_class", "profile_load"]

#: Builtin tensor methods that copy a value to the host (where CUDA makes the host wait).
HOST_READS = ("cpu", "item", "tolist", "nonzero", "numpy", "synchronize")


@dataclass(frozen=True, slots=True)
class HostSplit:
    wall_s: float
    batch_s: float
    batches: int
    tokenise_s: float
    tokenise_in_batch_s: float
    tokenise_calls: int
    template_calls: int
    reads_s: float
    reads: int

    @property
    def rest_s(self) -> float:
        return max(0.0, self.batch_s - self.tokenise_in_batch_s - self.reads_s)


@dataclass(frozen=True, slots=True)
class DeviceSplit:
    on_cuda: bool
    total_s: float
    classes: dict[str, float]
    launches: int
    syncs: int
    sync_wait_s: float
    host_reads: int
    batches: int


def kernel_class(name: str) -> str:
    """One of matmul, attention, elementwise/copy, other for a kernel or operator name."""
    n = name.lower()
    if any(k in n for k in ("attention", "sdpa", "flash", "fmha", "_efficient_attention")):
        return "attention"
    if any(
        k in n
        for k in ("gemm", "gemv", "matmul", "aten::mm", "addmm", "bmm", "linear", "cutlass", "xmma")
    ):
        return "matmul"
    if any(
        k in n
        for k in (
            "elementwise",
            "copy",
            "memcpy",
            "memset",
            "cat",
            "index",
            "fill",
            "zero",
            "where",
            "mask",
            "add",
            "mul",
            "sub",
            "div",
            "rsqrt",
            "pow",
            "mean",
            "neg",
            "silu",
            "exp",
            "reduce",
            "clone",
            "contiguous",
            "embedding",
            "aten::to",
            "cumsum",
            "clamp",
            "eq",
            "lt",
            "gt",
            "and",
            "or",
            "softmax",
            "logsumexp",
        )
    ):
        return "elementwise/copy"
    return "other"


class TokeniserClock:
    """Times the tokenizer's ``__call__`` and ``apply_chat_template`` while installed, apart
    inside an engine batch (``ModelRunner.locked``, on whichever thread runs it) and outside
    (cProfile keeps callers one level up only, which cannot tell the two apart)."""

    def __init__(self) -> None:
        self.calls = {"__call__": 0, "apply_chat_template": 0}
        self.inside = 0.0
        self.outside = 0.0
        self.batches = 0
        self.batch_s = 0.0
        self._local = threading.local()
        self._undo: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str, timed: bool) -> None:
        orig = getattr(owner, name)
        clock = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not timed:  # a batch: the model lock held
                depth = getattr(clock._local, "depth", 0)
                clock._local.depth = depth + 1
                t0 = time.perf_counter()
                try:
                    return orig(*args, **kwargs)
                finally:
                    clock._local.depth = depth
                    if not depth:
                        clock.batches += 1
                        clock.batch_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                clock.calls[name] += 1
                if getattr(clock._local, "depth", 0):
                    clock.inside += dt
                else:
                    clock.outside += dt

        setattr(owner, name, wrapper)
        self._undo.append((owner, name, orig))

    def __enter__(self) -> TokeniserClock:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        from dpicl.engines.transformers.runner import ModelRunner

        self._wrap(ModelRunner, "locked", timed=False)
        self._wrap(PreTrainedTokenizerBase, "__call__", timed=True)
        self._wrap(PreTrainedTokenizerBase, "apply_chat_template", timed=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)
        self._undo.clear()


def host_split(prof: cProfile.Profile, wall_s: float, clock: TokeniserClock) -> HostSplit:
    stats = pstats.Stats(prof)
    reads_n, reads_s = 0, 0.0
    for (file, _line, fn), (_cc, nc, tt, _ct, _who) in stats.stats.items():  # type: ignore[attr-defined]
        if file == "~" and any(f"'{m}' of 'torch._C" in fn for m in HOST_READS):
            reads_n += nc
            reads_s += tt
    return HostSplit(
        wall_s,
        clock.batch_s,
        clock.batches,
        clock.inside + clock.outside,
        clock.inside,
        clock.calls["__call__"],
        clock.calls["apply_chat_template"],
        reads_s,
        reads_n,
    )


def device_split(prof: Any, on_cuda: bool) -> DeviceSplit:
    classes: dict[str, float] = {}
    launches = syncs = host_reads = batches = 0
    sync_wait = 0.0
    total = 0.0
    for ev in prof.key_averages():
        name = ev.key
        if name == "dpicl::batch":
            batches += ev.count
            continue
        if "LaunchKernel" in name or "cuLaunch" in name:
            launches += ev.count
        if "Synchronize" in name:
            syncs += ev.count
            sync_wait += ev.self_cpu_time_total / 1e6
        if name in ("aten::_local_scalar_dense", "aten::nonzero", "aten::item") or (
            "Memcpy DtoH" in name
        ):
            host_reads += ev.count
        if on_cuda:
            t = float(getattr(ev, "self_device_time_total", 0.0) or 0.0) / 1e6
            if getattr(ev, "device_type", None) is not None and "CUDA" not in str(ev.device_type):
                continue
        else:
            if not name.startswith("aten::"):
                continue
            t = ev.self_cpu_time_total / 1e6
        if t <= 0:
            continue
        cls = kernel_class(name)
        classes[cls] = classes.get(cls, 0.0) + t
        total += t
    return DeviceSplit(on_cuda, total, classes, launches, syncs, sync_wait, host_reads, batches)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def show(label: str, host: HostSplit, dev: DeviceSplit | None) -> None:
    w = host.wall_s
    print(f"profile {label}:")
    print(
        f"  host (cProfile): wall {w:.3f} s; inside {host.batches} engine batches "
        f"{host.batch_s:.3f} s ({_pct(host.batch_s, w)})"
    )
    print(
        f"    tokenising and templating {host.tokenise_s:.3f} s ({_pct(host.tokenise_s, w)}; "
        f"{host.tokenise_in_batch_s:.3f} s on the engine's thread inside batches): "
        f"{host.tokenise_calls} tokenizer calls, {host.template_calls} chat-template calls"
    )
    print(
        f"    reading results back (the host waits for the device here on CUDA) "
        f"{host.reads_s:.3f} s ({_pct(host.reads_s, w)}): {host.reads} reads"
    )
    print(
        f"    the rest of the batches (Python, launches; on the CPU the kernels too) "
        f"{host.rest_s:.3f} s ({_pct(host.rest_s, w)})"
    )
    if dev is None:
        return
    what = "CUDA kernels" if dev.on_cuda else "CPU operators (no GPU: kernels run on the host)"
    parts = "  ".join(
        f"{k} {_pct(dev.classes.get(k, 0.0), dev.total_s)}"
        for k in ("matmul", "attention", "elementwise/copy", "other")
    )
    print(f"  device (torch.profiler, self time of {what}): {dev.total_s:.3f} s; {parts}")
    per = max(dev.batches, 1)
    print(
        f"    {dev.batches} batches; kernel launches {dev.launches} ({dev.launches / per:.0f} a "
        f"batch); synchronisations {dev.syncs} ({dev.syncs / per:.1f} a batch, "
        f"{dev.sync_wait_s:.3f} s waiting in them); host reads {dev.host_reads} "
        f"({dev.host_reads / per:.1f} a batch)"
    )


async def profile_load(
    label: str,
    load: Callable[[], Awaitable[float]],
    device: str,
    engine: Any = None,
    *,
    torch_pass: bool = True,
) -> tuple[HostSplit, DeviceSplit | None]:
    """Run ``load`` twice, under cProfile and under torch.profiler, and print the split.

    Both profilers see only the thread that starts them, so a transformers engine runs its
    batches in this thread for the passes (``ModelRunner.inline``, as it does in the engine
    process of ``dpicl serve``), not in a worker thread as in the bench's timed rows."""
    inline = getattr(engine, "inline", None)
    if inline is not None:
        engine.inline = True
    try:
        return await _passes(label, load, device, torch_pass)
    finally:
        if inline is not None:
            engine.inline = inline


async def _passes(
    label: str, load: Callable[[], Awaitable[float]], device: str, torch_pass: bool
) -> tuple[HostSplit, DeviceSplit | None]:
    prof = cProfile.Profile()
    with TokeniserClock() as clock:
        t0 = time.perf_counter()
        prof.enable()
        try:
            await load()
        finally:
            prof.disable()
        wall = time.perf_counter() - t0
    host = host_split(prof, wall, clock)
    dev = None
    if torch_pass:
        import torch
        from torch.profiler import ProfilerActivity, profile

        on_cuda = device.startswith("cuda") and torch.cuda.is_available()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
        with profile(activities=acts) as tp:
            await load()
        if on_cuda:
            torch.cuda.synchronize()
        dev = device_split(tp, on_cuda)
    show(label, host, dev)
    return host, dev
