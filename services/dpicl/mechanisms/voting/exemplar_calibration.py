"""``label_calibration: "exemplars"``: batch calibration of each voting partition (Zhou et al.
2024, "Batch Calibration"), with the partition's own exemplar inputs as the batch.

Partition t's bias is the mean label distribution (in log space,
:func:`dpicl.pipelines.votes.exemplar_bias`) of its own exemplars' inputs, each scored as a
query under partition t's prompt. It is a function of partition t's exemplars and the public
template only, so partition t's calibrated vote still depends on its own partition alone:
one changed exemplar moves at most one vote, voting's L2 sensitivity stays sqrt(2) (paper
000, Algorithm 2; DESIGN section 4's reading of voting) and the guarantee is unchanged.

The bias does not depend on the query, so it is computed once per (context, engine), in the
same paid engine batch as the first query that needs it (a failure refunds it with the
query), and kept in a bounded cache keyed by the context's id and checked against the fields
it was made from. Keyed by id, so no two contexts share an entry (a shared one would be a
timing side channel between them); the first answer of a context takes the k exemplar
prompts longer, a cost fixed by the context's public shape.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from dpicl.engines.base import Engine, PromptSpec
from dpicl.pipelines.partitions import partition_exemplar_prompts, partition_source
from dpicl.pipelines.votes import exemplar_bias
from dpicl.store.repository import StoredContext

FloatArray = npt.NDArray[np.float64]

__all__ = ["EXEMPLAR_BIASES", "BiasCache", "biases_from_scores", "exemplar_prompts"]


def _source(context: StoredContext, engine: Engine) -> tuple[object, ...]:
    return (id(engine), engine.name, *partition_source(context))


def biases_from_scores(sizes: list[int], scores: FloatArray) -> FloatArray:
    """The (T, L) biases from the exemplar prompts' scores, stacked partition by partition
    (``sizes[t]`` rows for partition t): row t is :func:`exemplar_bias` of partition t's rows
    only."""
    rows, start = [], 0
    for k in sizes:
        rows.append(exemplar_bias(scores[start : start + k]))
        start += k
    return np.concatenate(rows, axis=0)


class BiasCache:
    """The exemplar biases of the most recently used ``max_entries`` contexts."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[str, tuple[tuple[object, ...], FloatArray]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, context: StoredContext, engine: Engine) -> FloatArray | None:
        """The context's (T, L) biases under ``engine``, or None when not (or no longer)
        cached."""
        source = _source(context, engine)
        with self._lock:
            hit = self._items.get(context.id)
            if hit is None or hit[0] != source:
                return None
            self._items.move_to_end(context.id)
            return hit[1]

    def put(self, context: StoredContext, engine: Engine, biases: FloatArray) -> None:
        with self._lock:
            self._items.pop(context.id, None)
            self._items[context.id] = (_source(context, engine), biases)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


#: T x L floats per context (20 KiB at T = 256, L = 10): 4,096 contexts hold at most about
#: 80 MiB. A deleted context's entry is never read again (ids are not reused) and ages out.
EXEMPLAR_BIASES = BiasCache(max_entries=4096)


def exemplar_prompts(context: StoredContext) -> tuple[list[int], list[PromptSpec]]:
    """The prompts whose scores :func:`biases_from_scores` needs, and each partition's count."""
    per_partition = partition_exemplar_prompts(context)
    return [len(p) for p in per_partition], [q for p in per_partition for q in p]
