"""A KV cache that a scoring forward appends to in place, in reused scratch memory.

A warm scoring batch continues every row from its cached prompt prefix. Stacking those
prefixes in a transformers ``DynamicCache`` copies them three times a batch: into a padded
batch tensor, again when the cache is built from it (``update`` concatenates onto an empty
tensor), and once more in every layer when the forward appends the new tokens
(``torch.cat``). The batch tensor is also freshly allocated every time, and a tensor of that
size (tens of MiB) is fresh pages from the operating system, which fault in one 4 KiB page
at a time when first written: about 11,000 faults for a ten-partition batch of SmolLM2-135M.

:class:`SlotCache` lays the prefixes out once, with room after them for the forward's new
tokens (:func:`~.kv_layout.slot_prefixes`), and each :class:`SlotLayer` writes
the new keys and values into that room instead of concatenating. :class:`KVWorkspace` keeps
the memory between batches (up to a bound), so a warm batch writes into pages it already
has. A warm T = 10 engine call went from 491 to 462 ms (interleaved in one process, page
faults 11,800 -> 860 a call); ``bench/voting.py`` measures each part side by side.

Free-text generation uses the same layout with room for its decoding steps too, so a
step writes its token's keys and values in place rather than concatenating onto the whole
cache in every layer (``torch.cat`` was 10% of a ten-partition generation's CPU time).

A slot cache in the workspace lives for one engine call under the engine's lock (a scoring
forward, or a generation's prefill and decoding steps): the next batch reuses the same
memory, so nothing that outlives the call may hold one. A DPS-MOZO decoding session, which
lives across calls, keeps its KV in slots of its own (:func:`own_slots`): with
concatenation every token copied the session's whole cache in every layer (``torch.cat``,
10% of a five-prompt session's step at 170 tokens, growing with the length).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["KVWorkspace", "SlotCache", "SlotLayer", "own_slots"]


class SlotLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """One layer's keys and values in preallocated (B, heads, slots, dim) tensors, of which
    the first ``filled`` positions hold the past; :meth:`update` writes the new tokens after
    them. A forward that brings more tokens than there are slots left moves the layer to
    new slots of twice the size (at least what it needs; memory of its own, never the
    workspace's), so a long decode copies its cache O(log length) times, not every step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._slots = (keys, values)
        self._filled = filled
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values = keys[:, :, :filled], values[:, :, :filled]
        self.is_initialized = True

    @property
    def capacity(self) -> int:
        """Positions the layer holds before it must move."""
        return int(self._slots[0].shape[-2])

    def _grow(self, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self._slots
        shape = (*old_k.shape[:2], max(need, 2 * self.capacity), old_k.shape[-1])
        keys, values = old_k.new_empty(shape), old_v.new_empty(shape)
        keys[:, :, : self._filled] = old_k[:, :, : self._filled]
        values[:, :, : self._filled] = old_v[:, :, : self._filled]
        self._slots = (keys, values)
        return keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._filled + key_states.shape[-2]
        keys, values = self._slots if end <= self.capacity else self._grow(end)
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


def own_slots(layers: Sequence[tuple[torch.Tensor, torch.Tensor]], room: int) -> SlotCache:
    """A cache's per-layer ``(K, V)`` (each (B, heads, n, dim)) copied into new slots of
    their own with ``room`` more positions per row (beyond it, :class:`SlotLayer` doubles)."""
    k0 = layers[0][0]
    filled = int(k0.shape[-2])
    slots = k0.new_empty((len(layers), 2, *k0.shape[:2], filled + room, k0.shape[-1]))
    for i, (k, v) in enumerate(layers):
        slots[i, 0, :, :, :filled] = k
        slots[i, 1, :, :, :filled] = v
    return SlotCache(slots, filled)


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
