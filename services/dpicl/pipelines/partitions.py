"""Turning a context and a query into prompts: the T partition prompts (voting, ESA and
their variants), the zero-shot prompt, and the checks of a query."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dpicl.domain import is_blank
from dpicl.engines.base import Exemplar, PromptSpec
from dpicl.errors import InvalidRequest
from dpicl.pipelines.partitioning import assign_partitions, group_by_partition
from dpicl.prompts import PromptPlan, plan
from dpicl.store.repository import StoredContext


class PartitionLayout(BaseModel):
    """How a partitioned context splits its exemplars, as its mechanism record stores it:
    T partitions, the permutation's seed, the scheme. The calibration of every
    partition-and-aggregate mechanism extends it (:mod:`dpicl.mechanisms.partitioned`), so
    the record is parsed once for both (:meth:`StoredContext.record_as`)."""

    # The record holds the mechanism's other fields too; only these are read here.
    model_config = ConfigDict(frozen=True, extra="ignore")

    partitions: int
    partition_seed: int
    partitioning: Literal["positional", "hash"]


def exemplars_of(context: StoredContext) -> list[Exemplar]:
    return [Exemplar(input=i, output=o) for i, o in context.exemplars]


def check_query(query: str, max_chars: int) -> str:
    if is_blank(query):
        raise InvalidRequest(
            "query must contain a visible character (not only whitespace or invisible "
            f"characters); got {query[:40]!r}",
            param="query",
        )
    if len(query) > max_chars:
        raise InvalidRequest(
            f"query has {len(query)} characters; the limit is {max_chars}", param="query"
        )
    return query


@lru_cache(maxsize=1024)
def _partition_positions(
    exemplars: tuple[tuple[str, str], ...], partitions: int, seed: int, scheme: str
) -> tuple[tuple[int, ...], ...]:
    ids = assign_partitions(exemplars, partitions, seed, scheme)  # type: ignore[arg-type]
    return tuple(tuple(int(i) for i in g) for g in group_by_partition(ids, partitions))


def prefix_cache_key(context: StoredContext, part: int | str) -> str:
    """The engine's prefix-cache key of one partition (or ``"zero"``) of one context.

    Keyed by the context's id, so two contexts never share cached state, even with
    identical exemplars (a shared cache would be a timing side channel between them).
    """
    return f"{context.id}/{part}"


@dataclass(frozen=True, slots=True)
class _ContextPlans:
    """A context's prompts up to the query: one plan per partition and the zero-shot one,
    with the fields they were made from (checked on every use)."""

    source: tuple[object, ...]
    partitions: tuple[PromptPlan, ...]
    zero: PromptPlan
    chars: int


class _PlanCache:
    """The prompt plans of recently queried contexts, at most ``max_chars`` characters of
    them, least recently used first out. Keyed by context id; an entry is used only while
    the context's template, task, labels, exemplars and partitioning are the ones it was
    made from (a context's fields never change, but a test may reuse an id)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._items: OrderedDict[str, _ContextPlans] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, context: StoredContext) -> _ContextPlans:
        source = partition_source(context)
        with self._lock:
            hit = self._items.get(context.id)
            if hit is not None and hit.source == source:
                self._items.move_to_end(context.id)
                return hit
        plans = _make_plans(context, source)
        if plans.chars <= self.max_chars:
            with self._lock:
                old = self._items.pop(context.id, None)
                if old is not None:
                    self._chars -= old.chars
                self._items[context.id] = plans
                self._chars += plans.chars
                while self._chars > self.max_chars:
                    _, dropped = self._items.popitem(last=False)
                    self._chars -= dropped.chars
        return plans


def _make_plans(context: StoredContext, source: tuple[object, ...]) -> _ContextPlans:
    layout = context.record_as(PartitionLayout)
    groups = _partition_positions(
        context.exemplars, layout.partitions, layout.partition_seed, layout.partitioning
    )
    exemplars = exemplars_of(context)
    labels = context.labels
    parts = tuple(
        plan(context.template, [exemplars[i] for i in group], task=context.task, labels=labels)
        for group in groups
    )
    zero = plan(context.template, [], task=context.task, labels=labels)
    chars = zero.chars + sum(p.chars for p in parts)
    return _ContextPlans(source=source, partitions=parts, zero=zero, chars=chars)


#: Rendering a context's T prompts took as long as the rest of an oracle answer's pipeline;
#: a context's plans are rendered once and each query is joined into them.
_PLANS = _PlanCache(max_chars=32 * 2**20)


def partition_prompts(context: StoredContext, query: str) -> list[PromptSpec]:
    """The T prompts of one query: each partition's exemplars around the query."""
    plans = _PLANS.get(context)
    # A partition whose prompt does not fit the model is answered from the zero-shot prompt
    # instead of failing the call: a refusal would depend on the exemplars (PromptSpec.fallback).
    zero = _zero_shot(context, query, plans.zero)
    return [
        p.prompt(
            query, cache_scope=context.id, cache_key=prefix_cache_key(context, t), fallback=zero
        )
        for t, p in enumerate(plans.partitions)
    ]


def partition_exemplar_prompts(context: StoredContext) -> list[list[PromptSpec]]:
    """Per partition t, its own exemplars' inputs each asked as a query under partition t's
    prompt (the batch of batch calibration, Zhou et al. 2024): the same prompts
    :func:`partition_prompts` makes, with the same zero-shot fallback, so partition t's
    list depends on partition t's exemplars and the public template only."""
    plans = _PLANS.get(context)
    layout = context.record_as(PartitionLayout)
    groups = _partition_positions(
        context.exemplars, layout.partitions, layout.partition_seed, layout.partitioning
    )
    out: list[list[PromptSpec]] = []
    for t, (p, group) in enumerate(zip(plans.partitions, groups, strict=True)):
        inputs = [context.exemplars[i][0] for i in group]
        out.append(
            [
                p.prompt(
                    x,
                    cache_scope=context.id,
                    cache_key=prefix_cache_key(context, t),
                    fallback=_zero_shot(context, x, plans.zero),
                )
                for x in inputs
            ]
        )
    return out


def _zero_shot(context: StoredContext, query: str, zero: PromptPlan) -> PromptSpec:
    return zero.prompt(query, cache_scope=context.id, cache_key=prefix_cache_key(context, "zero"))


def zero_shot_prompt(context: StoredContext, query: str) -> PromptSpec:
    """The query in the context's template with no exemplars (public: costs no privacy)."""
    return _zero_shot(
        context, query, plan(context.template, [], task=context.task, labels=context.labels)
    )


def partition_source(context: StoredContext) -> tuple[object, ...]:
    """What a context's partition prompts are made of: a cache keyed by it is stale exactly
    when one of these changes."""
    layout = context.record_as(PartitionLayout)
    return (
        context.template,
        context.task,
        context.labels,
        context.exemplars,
        layout.partitions,
        layout.partition_seed,
        layout.partitioning,
    )
