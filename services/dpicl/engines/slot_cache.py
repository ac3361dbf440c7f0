"""A KV cache that a scoring forward appends to in place, in reused scratch memory.

A warm scoring batch continues every row from its cached prompt prefix. Stacking those
prefixes in a transformers ``DynamicCache`` copies them three times a batch: into a padded
batch tensor, again when the cache is built from it (``update`` concatenates onto an empty
tensor), and once more in every layer when the forward appends the new tokens
(``torch.cat``). The batch tensor is also freshly allocated every time, and a tensor of that
size (tens of MiB) is fresh pages from the operating system, which fault in one 4 KiB page
at a time when first written: about 11,000 faults for a ten-partition batch of SmolLM2-135M.

:class:`SlotCache` lays the prefixes out once, with room after them for the forward's new
tokens (:func:`~dpicl.engines.kv_layout.slot_prefixes`), and each :class:`SlotLayer` writes
the new keys and values into that room instead of concatenating. :class:`KVWorkspace` keeps
the memory between batches (up to a bound), so a warm batch writes into pages it already
has. A warm T = 10 engine call went from 491 to 462 ms (interleaved in one process, page
faults 11,800 -> 860 a call); ``bench/voting.py`` measures each part side by side.

Free-text generation uses the same layout with room for its decoding steps too, so a
step writes its token's keys and values in place rather than concatenating onto the whole
cache in every layer (``torch.cat`` was 10% of a ten-partition generation's CPU time).

A slot cache lives for one engine call under the engine's lock (a scoring forward, or a
generation's prefill and decoding steps): the next batch reuses the same memory, so
nothing that outlives the call (a DPS-MOZO decoding session) may hold one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["KVWorkspace", "SlotCache", "SlotLayer"]


class SlotLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """One layer's keys and values in preallocated (B, heads, slots, dim) tensors, of which
    the first ``filled`` positions hold the past; :meth:`update` writes the new tokens after
    them. A forward that brings more tokens than there are slots left grows by
    concatenation, as :class:`~transformers.cache_utils.DynamicLayer` does."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._slots: tuple[torch.Tensor, torch.Tensor] | None = (keys, values)
        self._filled = filled
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values = keys[:, :, :filled], values[:, :, :filled]
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        slots = self._slots
        end = self._filled + key_states.shape[-2]
        if slots is None or end > slots[0].shape[-2]:
            self._slots = None
            return super().update(key_states, value_states, *args, **kwargs)
        keys, values = slots
        keys[:, :, self._filled : end] = key_states
        values[:, :, self._filled : end] = value_states
        self._filled = end
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values


class SlotCache(DynamicCache):
    """A ``DynamicCache`` over slots laid out as (layers, 2, B, heads, slots, dim), the first
    ``filled`` positions of each row holding its (padded) past."""

    def __init__(self, slots: torch.Tensor, filled: int) -> None:
        Cache.__init__(
            self, layers=[SlotLayer(layer[0], layer[1], filled) for layer in slots.unbind(0)]
        )


class KVWorkspace:
    """Scratch memory for :class:`SlotCache` layouts, kept between batches when it is at most
    ``keep_bytes`` (a larger batch gets memory of its own, freed after it).

    Not thread-safe, and a tensor it hands out is only valid until the next :meth:`take`:
    the engine takes it under its lock, for one forward at a time.
    """

    def __init__(self, keep_bytes: int) -> None:
        if keep_bytes < 0:
            raise ValueError(f"keep_bytes must be >= 0, got {keep_bytes}")
        self.keep_bytes = keep_bytes
        self._buf: torch.Tensor | None = None

    @property
    def kept_bytes(self) -> int:
        """Bytes held between batches now."""
        buf = self._buf
        return 0 if buf is None else buf.numel() * buf.element_size()

    def take(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of ``shape`` with ``like``'s dtype and device."""
        numel = math.prod(int(size) for size in shape)
        buf = self._buf
        if (
            buf is None
            or buf.numel() < numel
            or buf.dtype != like.dtype
            or buf.device != like.device
        ):
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            if numel * buf.element_size() <= self.keep_bytes:
                self._buf = buf
        return buf[:numel].view(*shape)

    def release(self) -> None:
        """Give the kept memory back."""
        self._buf = None
