"""The engine's memory for ``/metrics`` (``dpicl_engine_device_memory_bytes``): on a CUDA
device what torch allocated and reserved there and the device's total, on the CPU the
resident memory of the process the engine runs in. Read where the engine runs: the engine
process relays it (:mod:`dpicl.engines.process.main`); an engine in the server's process is
read when ``/metrics`` is scraped."""

from __future__ import annotations

import os
import sys

__all__ = ["device_memory"]


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None  # not Linux: no cheap reading; the metric is left out
    return pages * os.sysconf("SC_PAGE_SIZE")


def device_memory(device: str) -> list[tuple[str, str, float]]:
    """``(device, kind, bytes)`` samples of ``device`` (``cuda``, ``cuda:1``, ``cpu``)."""
    # torch only if the engine imported it: the oracle engine never does, and importing it
    # here would cost seconds and hundreds of MB for a reading of nothing.
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_available():
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        return [
            (device, "allocated", float(torch.cuda.memory_allocated(index))),
            (device, "reserved", float(torch.cuda.memory_reserved(index))),
            (device, "total", float(torch.cuda.get_device_properties(index).total_memory)),
        ]
    rss = _resident_bytes()
    return [("cpu", "resident", float(rss))] if rss is not None else []
