"""Serving knobs of the in-process transformers engine (DPICL_PREFIX_CACHE_*,
DPICL_KV_WORKSPACE_MIB, DPICL_BATCH_*).

Other engines ignore them: vLLM batches and caches prefixes by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Protocol

from dpicl.engines.placement import auto_prefix_cache_mib

__all__ = ["SHARED_PREFIX_MIN_KV_WIDTH", "EngineTuning"]

#: ``auto``'s smallest K/V width for shared-prefix attention on the CPU. Measured (engine
#: CPU per LLM call, 8 demonstrations a partition, in place vs copied per row): SmolLM2-135M
#: (3 K/V heads of 64: 192) 5% less in place; the 2-layer toy of bench/gpu.py --tiny (1
#: head of 64) 15-25% more, its per-group calls costing more than its small copies.
SHARED_PREFIX_MIN_KV_WIDTH = 192


class _TuningSettings(Protocol):
    prefix_cache_mib: int | None
    prefix_cache_entries: int
    kv_workspace_mib: int
    batch_wait_ms: float
    batch_max_prompts: int
    shared_prefix: Literal["auto", "on", "off"]
    engine_overlap: Literal["auto", "on", "off"]


@dataclass(frozen=True, slots=True)
class EngineTuning:
    """Prefix-cache and micro-batching settings, validated on construction.

    * ``prefix_cache_mib``: memory budget of the per-context prompt-prefix KV cache, in MiB
      (0 turns the cache off; ``None``: sized to the device when the model is loaded,
      :meth:`sized_for`). SmolLM2-135M needs about 45 KiB per cached token, so a
      ten-partition context with 110-token prefixes takes about 50 MiB; a Llama-3-8B shape
      in bfloat16 128 KiB per token.
    * ``prefix_cache_entries``: at most this many cached prefixes (one per partition).
    * ``kv_workspace_mib``: scratch memory kept between scoring and generation batches for
      laying out their cached prefixes with room for the new tokens
      (:mod:`dpicl.engines.transformers.slot_cache`);
      a batch that needs more gets memory of its own for that batch (0: every batch does).
      A ten-partition SmolLM2-135M batch needs about 56 MiB.
    * ``batch_wait_ms``: how long the first label-scoring or generation request of a batch
      waits for others to join it. 0 (the default): a batch starts as soon as the engine is
      free, with every request that queued while it was busy (callers of the last batch get
      a window to rejoin only when this is above 0, see :mod:`dpicl.engines.transformers.batching`).
    * ``batch_max_prompts``: at most this many prompts (rows) per merged batch; 1 turns
      batching across requests off.
    * ``shared_prefix``: whether warm scoring batches attend to each cached prefix where
      the cache holds it (``on``) or lay it out once per row first (``off``;
      :mod:`dpicl.engines.transformers.shared_prefix`). ``auto``: on where measured not
      slower (:meth:`shares_prefix_attention`).
    * ``overlap``: whether the score batcher launches the next batch before reading the last
      one's results back (:mod:`dpicl.engines.transformers.batching`, "Overlap"). ``auto``:
      on CUDA only (:meth:`overlaps`).
    """

    prefix_cache_mib: int | None = None
    prefix_cache_entries: int = 4096
    kv_workspace_mib: int = 128
    batch_wait_ms: float = 0.0
    batch_max_prompts: int = 256
    shared_prefix: Literal["auto", "on", "off"] = "auto"
    overlap: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self) -> None:
        if self.prefix_cache_mib is not None and self.prefix_cache_mib < 0:
            raise ValueError(f"prefix_cache_mib must be >= 0, got {self.prefix_cache_mib}")
        if self.prefix_cache_entries < 1:
            raise ValueError(f"prefix_cache_entries must be >= 1, got {self.prefix_cache_entries}")
        if self.kv_workspace_mib < 0:
            raise ValueError(f"kv_workspace_mib must be >= 0, got {self.kv_workspace_mib}")
        if not 0 <= self.batch_wait_ms <= 1000:
            raise ValueError(f"batch_wait_ms must lie in [0, 1000], got {self.batch_wait_ms}")
        if self.batch_max_prompts < 1:
            raise ValueError(f"batch_max_prompts must be >= 1, got {self.batch_max_prompts}")
        if self.shared_prefix not in ("auto", "on", "off"):
            raise ValueError(f"shared_prefix must be auto, on or off, got {self.shared_prefix!r}")
        if self.overlap not in ("auto", "on", "off"):
            raise ValueError(f"overlap must be auto, on or off, got {self.overlap!r}")

    def overlaps(self, device_type: str) -> bool:
        """Whether the score batcher overlaps batches on ``device_type``. ``auto``: on CUDA,
        where a forward runs behind the host's back; on the CPU it has run before the host
        could lay out anything, so overlap would only delay each batch's answers."""
        if self.overlap == "auto":
            return device_type == "cuda"
        return self.overlap == "on"

    def shares_prefix_attention(self, device_type: str, kv_width: int) -> bool:
        """Whether scoring on ``device_type`` attends to cached prefixes in place, for a
        model of ``kv_width`` K/V channels a token and layer (K/V heads x head size).
        ``auto``: on the CPU from :data:`SHARED_PREFIX_MIN_KV_WIDTH` up, as measured
        (docs/architecture.md, "Shared-prefix attention"); off on other devices until
        measured there."""
        if self.shared_prefix == "auto":
            return device_type == "cpu" and kv_width >= SHARED_PREFIX_MIN_KV_WIDTH
        return self.shared_prefix == "on"

    @property
    def prefix_cache_bytes(self) -> int:
        """The cache's budget in bytes (the CPU's default where not yet sized)."""
        mib = self.prefix_cache_mib
        return (auto_prefix_cache_mib("cpu", None) if mib is None else mib) * 2**20

    def sized_for(self, device_type: str, free_bytes: int | None) -> EngineTuning:
        """These settings with an unset prefix-cache budget sized to the device
        (:func:`~dpicl.engines.placement.auto_prefix_cache_mib`): call it once the weights
        are on the device, with the memory it has free then."""
        if self.prefix_cache_mib is not None:
            return self
        return replace(self, prefix_cache_mib=auto_prefix_cache_mib(device_type, free_bytes))

    @property
    def kv_workspace_bytes(self) -> int:
        return self.kv_workspace_mib * 2**20

    @classmethod
    def from_settings(cls, settings: _TuningSettings) -> EngineTuning:
        return cls(
            prefix_cache_mib=settings.prefix_cache_mib,
            prefix_cache_entries=settings.prefix_cache_entries,
            kv_workspace_mib=settings.kv_workspace_mib,
            batch_wait_ms=settings.batch_wait_ms,
            batch_max_prompts=settings.batch_max_prompts,
            shared_prefix=settings.shared_prefix,
            overlap=settings.engine_overlap,
        )
