"""An in-process LRU of contexts for the request path, bounded by the size of their texts.

A context's fields are immutable once created except its ledger columns (``mu2_spent``,
``queries``) and its existence. A query therefore needs no read of the row: it takes the
immutable fields from here and the ledger from the charge's own ``UPDATE ... RETURNING``,
one round trip in all. A deleted context is caught by that charge (no row is updated; the
ledger then reads the row, finds none and evicts it), so a stale entry can never be
charged or answered. Ledger columns cached here are as of the load and must not be shown.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from dpicl.store.records import StoredContext

#: Python's per-string overhead, counted for every cached text.
_STR_OVERHEAD = 64


def context_bytes(ctx: StoredContext) -> int:
    """An upper estimate of what caching ``ctx`` holds in memory."""
    texts = [ctx.template, *ctx.labels, *(t for pair in ctx.exemplars for t in pair)]
    return 1024 + sum(len(t.encode("utf-8", "surrogatepass")) + _STR_OVERHEAD for t in texts)


class ContextCache:
    """Least recently used contexts, at most ``max_bytes`` of them (0 disables it)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[StoredContext, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the store's worker threads evict too

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, context_id: str) -> StoredContext | None:
        with self._lock:
            hit = self._items.get(context_id)
            if hit is None:
                return None
            self._items.move_to_end(context_id)
            return hit[0]

    def put(self, ctx: StoredContext) -> None:
        size = context_bytes(ctx)
        if size > self.max_bytes:
            return  # larger than the whole cache: served from the database every time
        with self._lock:
            old = self._items.pop(ctx.id, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[ctx.id] = (ctx, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def evict(self, context_id: str) -> None:
        with self._lock:
            old = self._items.pop(context_id, None)
            if old is not None:
                self._bytes -= old[1]
