"""The vLLM engine's settings (``DPICL_VLLM_*``) as the engine takes them, the arguments of
its ``AsyncLLM`` built from them, and the per-context prefix-cache salt (HMAC-SHA256 of the
secret and the context id: docs/architecture.md, "Engine protocol")."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

from dpicl.config import Settings
from dpicl.errors import EngineError

__all__ = ["MAX_TOP_K", "VllmOptions", "cache_salt", "engine_args", "is_cpu_platform"]

# The largest top_k a DPS-MOZO context accepts (dpicl.domain); max_logprobs must cover it.
MAX_TOP_K = 1000


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """Engine settings (``DPICL_VLLM_*``). ``None`` means: vLLM's choice for the platform."""

    block_size: int = 32
    prefix_caching: bool = True
    gpu_memory_utilization: float | None = None
    kv_cache_gib: float | None = None
    max_model_len: int | None = None
    enforce_eager: bool = False
    dtype: str | None = None
    max_logprobs: int = MAX_TOP_K
    load_format: str = "auto"  # "dummy": random weights (benchmarks of a model's shape)
    # vLLM's own parallelism: shards of one model over GPUs (tensor), and copies of it
    # (data) behind one AsyncLLM, which balances requests over them.
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    salt_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> VllmOptions:
        """The options from ``DPICL_VLLM_*`` and ``DPICL_CACHE_SALT_SECRET``."""
        secret = settings.cache_salt_secret
        return cls(
            block_size=settings.vllm_block_size,
            prefix_caching=settings.vllm_prefix_caching,
            gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
            kv_cache_gib=settings.vllm_kv_cache_gib,
            max_model_len=settings.vllm_max_model_len,
            enforce_eager=settings.vllm_enforce_eager,
            tensor_parallel_size=settings.vllm_tensor_parallel_size,
            data_parallel_size=settings.vllm_data_parallel_size,
            dtype=None if settings.dtype == "auto" else settings.dtype,  # None: vLLM's choice
            load_format=settings.load_format,
            salt_secret=(
                secret.get_secret_value().encode()
                if secret is not None
                else secrets.token_bytes(32)
            ),
        )

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise EngineError(f"vllm block_size must be >= 1, got {self.block_size}")
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise EngineError(
                "vllm tensor_parallel_size and data_parallel_size must be >= 1, got "
                f"{self.tensor_parallel_size} and {self.data_parallel_size}"
            )
        if self.max_logprobs < 1:
            raise EngineError(f"vllm max_logprobs must be >= 1, got {self.max_logprobs}")
        if len(self.salt_secret) < 16:
            raise EngineError("the cache-salt secret must have at least 16 bytes")


def cache_salt(secret: bytes, scope: str) -> str:
    """The prefix-cache salt of a context: HMAC-SHA256(secret, scope), hex."""
    return hmac.new(secret, scope.encode("utf-8"), hashlib.sha256).hexdigest()


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_args(opts: VllmOptions, src: str, name: str, *, on_cpu: bool) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``AsyncEngineArgs`` for ``opts``."""
    kwargs: dict[str, Any] = {
        "model": src,
        "served_model_name": name,
        # float32 on the CPU build (DESIGN.md 9); the model's own dtype on a GPU.
        "dtype": opts.dtype or ("float32" if on_cpu else "auto"),
        "block_size": opts.block_size,
        "enable_prefix_caching": opts.prefix_caching,
        "max_logprobs": opts.max_logprobs,
        "logprobs_mode": "raw_logprobs",
        "enable_log_requests": False,
        "disable_log_stats": True,
        "enforce_eager": opts.enforce_eager,
        "load_format": opts.load_format,
        # On the CPU build this fraction is of host RAM: keep it small by default.
        "gpu_memory_utilization": opts.gpu_memory_utilization or (0.15 if on_cpu else 0.9),
    }
    if opts.max_model_len is not None:
        kwargs["max_model_len"] = opts.max_model_len
    # An explicit KV-cache size (1 GiB by default on the CPU build: ~20k tokens of the
    # bundled model) instead of a fraction of memory, which on CPU is measured from the
    # process's RSS after a warm-up pass and fails on a busy machine.
    kv_gib = opts.kv_cache_gib if opts.kv_cache_gib is not None else (1.0 if on_cpu else None)
    if kv_gib is not None:
        kwargs["kv_cache_memory_bytes"] = int(kv_gib * 2**30)
    kwargs["tensor_parallel_size"] = opts.tensor_parallel_size
    kwargs["data_parallel_size"] = opts.data_parallel_size
    return kwargs
