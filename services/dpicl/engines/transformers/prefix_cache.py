"""Per-context prompt-prefix KV cache for the transformers engine (issue 13).

Every query on a context renders the same text before the query slot for a given partition
(the chat template's system turn, the instructions and that partition's exemplars): about
110 of the 130 tokens of a typical voting prompt. This module keeps the KV state of those
tokens so a later query runs only its own tokens on top of it.

Keys and isolation. An entry is keyed by ``(cache_key, fingerprint)``: ``cache_key`` is set
by the server's pipelines from the context id and the partition (``PromptSpec.cache_key``),
and the fingerprint is a SHA-256 of the rendered prefix text, so an edited or re-created
context never meets stale state. Nothing is shared between contexts, even when their
prefixes are identical, because a shared cache is a timing side channel between them (a
hit reveals that another context holds the same text; vLLM's ``cache_salt`` exists for the
same reason). Entries store their prefix token ids; the engine reuses an entry only for a
prompt whose token ids start with exactly those ids, so a reused state is always the state
of this prompt's own tokens.

Bounds. An LRU over a byte budget (the K and V tensors) and an entry budget; an entry that
alone exceeds the byte budget is not stored. The cache is not thread-safe by itself: the
engine uses it only under its model lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Computed where prompts are tokenised (the server's side of the engine boundary).
from dpicl.engines.prompting import prefix_fingerprint
from dpicl.metrics import (
    PREFIX_CACHE_ENTRIES,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_LIMIT_BYTES,
    PREFIX_CACHE_MISSES,
    PREFIX_CACHE_SIZE_BYTES,
)

__all__ = ["PrefixCache", "PrefixEntry", "PrefixStats", "prefix_fingerprint"]

Layers = tuple[tuple[torch.Tensor, torch.Tensor], ...]


@dataclass(frozen=True, slots=True)
class PrefixEntry:
    """The KV state of one prefix: per layer ``(K, V)`` of shape (1, heads, len(ids), dim)."""

    ids: tuple[int, ...]
    layers: Layers
    # The same K and V in one (layers, 2, heads, len(ids), dim) tensor when the engine
    # packed them (``layers`` are then views of it), so a batch stacks an entry in one copy.
    packed: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.numel() * self.packed.element_size()
        return sum(
            k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers
        )

    def matches(self, ids: Sequence[int]) -> bool:
        """Whether a prompt with token ``ids`` starts with this prefix and goes on past it."""
        n = len(self.ids)
        return len(ids) > n and tuple(ids[:n]) == self.ids


def prefix_lens(found: Sequence[PrefixEntry | None]) -> list[int]:
    """Tokens of each row's cached prefix (0 where a row has none)."""
    return [len(e.ids) if e is not None else 0 for e in found]


@dataclass(slots=True)
class PrefixStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class PrefixCache:
    """An LRU of :class:`PrefixEntry` under a byte and an entry budget."""

    def __init__(self, max_bytes: int, max_entries: int = 4096) -> None:
        if max_bytes < 0 or max_entries < 1:
            raise ValueError(
                f"need max_bytes >= 0 and max_entries >= 1, got {max_bytes}, {max_entries}"
            )
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.nbytes = 0
        self.stats = PrefixStats()
        self._entries: OrderedDict[tuple[str, str], PrefixEntry] = OrderedDict()
        self._publish()

    def _publish(self) -> None:
        """What it holds, for /metrics (every change; the budget too: the engine process's
        metrics are relayed from the first answer on, after this cache was built)."""
        PREFIX_CACHE_SIZE_BYTES.set(self.nbytes)
        PREFIX_CACHE_ENTRIES.set(len(self._entries))
        PREFIX_CACHE_LIMIT_BYTES.set(self.max_bytes)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[tuple[tuple[str, str], PrefixEntry]]:
        """The entries, least recently used first (without touching their recency)."""
        return list(self._entries.items())

    def get(self, key: tuple[str, str]) -> PrefixEntry | None:
        entry = self._entries.get(key)
        if entry is None:
            self.stats.misses += 1
            PREFIX_CACHE_MISSES.inc()
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        PREFIX_CACHE_HITS.inc()
        return entry

    def put(self, key: tuple[str, str], entry: PrefixEntry) -> None:
        size = entry.nbytes
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        if size > self.max_bytes:
            self._publish()
            return
        self._entries[key] = entry
        self.nbytes += size
        while self.nbytes > self.max_bytes or len(self._entries) > self.max_entries:
            _, dropped = self._entries.popitem(last=False)
            self.nbytes -= dropped.nbytes
            self.stats.evictions += 1
        self._publish()

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0
        self._publish()
