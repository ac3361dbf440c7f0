"""Where and how a model's weights live: the device (``DPICL_DEVICE``), the dtype they load
in (``DPICL_DTYPE``), the source of the weights (``DPICL_LOAD_FORMAT``) and the memory the
prefix cache may take on the device once they are there.

* ``auto`` device (the default) is the CUDA GPU where torch sees one, the CPU otherwise. It is
  resolved where the model loads (in the engine process, which imports torch anyway; the
  oracle and vLLM never resolve it), logged there, and ``/readyz`` shows the device chosen
  beside the setting (``device``, ``device_setting``).
* ``auto`` dtype is bfloat16 on a CUDA device that supports it, float16 on one that does not
  (pre-Ampere), and float32 on the CPU, where half precision is slow or unsupported for the
  kernels the engine uses. A float32 copy of an 8B model is 32 GB; the weights are loaded
  straight onto the device in the chosen dtype, never first as float32 in host memory.
* ``dummy`` builds the model from its ``config.json`` with random weights, directly on the
  device (vLLM's name for the same thing): the compute of the real model without its
  weights, for capacity planning. It answers nonsense and is only ever used when set
  explicitly; the server's log and ``/readyz`` say so.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AUTO_DEVICE",
    "CPU_PREFIX_CACHE_MIB",
    "CUDA_CACHE_FRACTION",
    "DTYPES",
    "auto_prefix_cache_mib",
    "placement_of",
    "resolve_device",
    "resolve_dtype",
]

#: ``DPICL_DEVICE``'s default: the CUDA GPU where torch sees one, the CPU otherwise.
AUTO_DEVICE = "auto"

DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")

#: The prefix cache's budget where the device is the CPU: SmolLM2-135M needs about 45 KiB
#: per cached token, so 256 MiB holds about 50 ten-partition contexts.
CPU_PREFIX_CACHE_MIB = 256
#: Share of the device memory left free after the weights that the prefix cache may take on
#: a GPU. The rest is for activations and the batch's KV layout: a batch of 256 prompts of
#: 300 tokens on an 8B model lays out about 10 GB of KV.
CUDA_CACHE_FRACTION = 0.4


def resolve_device(setting: str) -> str:
    """The torch device of ``DPICL_DEVICE=setting``: for ``auto``, ``cuda`` where torch sees a
    CUDA GPU and ``cpu`` otherwise; any other setting as it is. Imports torch for ``auto``
    (only where a model loads)."""
    if setting != AUTO_DEVICE:
        return setting
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(setting: str, device_type: str, *, bf16_supported: bool = True) -> str:
    """The dtype name the weights load in, for ``DPICL_DTYPE=setting`` on ``device_type``.

    ``bf16_supported``: whether the CUDA device computes in bfloat16
    (``torch.cuda.is_bf16_supported()``); ignored elsewhere.
    """
    if setting == "auto":
        if device_type == "cuda":
            return "bfloat16" if bf16_supported else "float16"
        return "float32"
    if setting not in DTYPES:
        raise ValueError(f"unknown dtype {setting!r}; expected auto or one of {', '.join(DTYPES)}")
    return setting


def auto_prefix_cache_mib(device_type: str, free_bytes: int | None) -> int:
    """The prefix cache's budget (MiB) where ``DPICL_PREFIX_CACHE_MIB`` is unset: a share of
    what the device has free after the weights on a GPU, :data:`CPU_PREFIX_CACHE_MIB` on
    the CPU (host memory is the machine's, shared with everything else)."""
    if device_type != "cuda" or free_bytes is None:
        return CPU_PREFIX_CACHE_MIB
    return max(CPU_PREFIX_CACHE_MIB, int(free_bytes * CUDA_CACHE_FRACTION) // 2**20)


def placement_of(engine: object) -> dict[str, Any]:
    """Where the engine runs and what it loaded, as far as the engine says (the oracle and
    vLLM say less than the transformers engine)."""
    tuning = getattr(engine, "tuning", None)
    device = getattr(engine, "device", None)
    return {
        "device": str(device) if device is not None else None,
        "dtype": getattr(engine, "dtype", None),
        "load_format": getattr(engine, "load_format", None),
        "engine_pid": getattr(engine, "engine_pid", None),
        "prefix_cache_mib": getattr(engine, "prefix_cache_mib", None)
        or getattr(tuning, "prefix_cache_mib", None),
    }
