"""Turning a context and a query into prompts: the T partition prompts (voting, ESA and
their variants), the zero-shot prompt, and the checks of a query."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from dpicl.domain import is_blank
from dpicl.engines.base import Exemplar, PromptSpec
from dpicl.errors import InvalidRequest
from dpicl.mechanisms.partitioning import assign_partitions, group_by_partition
from dpicl.prompts import render
from dpicl.store.repository import StoredContext


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


def partition_prompts(context: StoredContext, query: str) -> list[PromptSpec]:
    """The T prompts of one query: each partition's exemplars around the query."""
    m = context.mechanism
    groups = _partition_positions(
        context.exemplars, int(m["partitions"]), int(m["partition_seed"]), str(m["partitioning"])
    )
    exemplars = exemplars_of(context)
    # A partition whose prompt does not fit the model is answered from the zero-shot prompt
    # instead of failing the call: a refusal would depend on the exemplars (PromptSpec.fallback).
    zero = zero_shot_prompt(context, query)
    return [
        replace(
            render(
                context.template,
                [exemplars[i] for i in group],
                query,
                task=context.task,
                labels=context.labels,
                cache_scope=context.id,
            ),
            cache_key=prefix_cache_key(context, t),
            fallback=zero,
        )
        for t, group in enumerate(groups)
    ]


def zero_shot_prompt(context: StoredContext, query: str) -> PromptSpec:
    """The query in the context's template with no exemplars (public: costs no privacy)."""
    return replace(
        render(
            context.template,
            [],
            query,
            task=context.task,
            labels=context.labels,
            cache_scope=context.id,
        ),
        cache_key=prefix_cache_key(context, "zero"),
    )
