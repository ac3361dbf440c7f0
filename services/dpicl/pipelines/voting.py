"""Private voting (Algorithm 2 of paper 000) as a request pipeline.

query -> T partition prompts (one engine batch) -> label scores -> per-partition votes ->
Gaussian-noised histogram -> noisy argmax. The ledger is charged before the engine runs and
refunded if the engine fails, so a failure costs nothing and no answer escapes unpaid.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dpicl.engines.base import Engine, PromptSpec
from dpicl.errors import DpiclError, EngineError, InvalidRequest
from dpicl.mechanisms.partitioning import assign_partitions, group_by_partition
from dpicl.mechanisms.voting import VotingRelease, private_vote
from dpicl.pipelines.contexts import cost_of, exemplars_of
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.prompts import render
from dpicl.store.repository import ContextRepository, StoredContext


@dataclass(frozen=True, slots=True)
class VotingOutcome:
    context: StoredContext
    label: str
    release: VotingRelease
    sigma: float
    cost: Cost
    budget: BudgetStatus


def check_query(query: str, max_chars: int) -> str:
    if not query.strip():
        raise InvalidRequest("query must not be empty or whitespace", param="query")
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


def partition_prompts(context: StoredContext, query: str) -> list[PromptSpec]:
    """The T prompts of one query: each partition's exemplars around the query."""
    m = context.mechanism
    groups = _partition_positions(
        context.exemplars, int(m["partitions"]), int(m["partition_seed"]), str(m["partitioning"])
    )
    exemplars = exemplars_of(context)
    return [
        render(
            context.template,
            [exemplars[i] for i in group],
            query,
            task=context.task,
            labels=context.labels,
        )
        for group in groups
    ]


async def run_voting(
    context: StoredContext,
    query: str,
    *,
    engine: Engine,
    ledger: Ledger,
    repo: ContextRepository,
    rng: np.random.Generator,
) -> VotingOutcome:
    prompts = partition_prompts(context, query)
    cost = cost_of(context)
    await ledger.charge(context, cost)
    try:
        scores = await engine.score_labels(prompts, context.labels)
    except Exception as exc:
        await ledger.refund(context, cost)
        if isinstance(exc, DpiclError) and not isinstance(exc, EngineError):
            raise
        raise EngineError(f"the {engine.name} engine failed: {exc}") from exc
    sigma = float(context.mechanism["sigma"])
    release = private_vote(
        np.asarray(scores, dtype=np.float64),
        sigma,
        float(context.mechanism["temperature"]),
        rng,
    )
    fresh = await repo.get(context.id)
    status = Ledger.status(fresh or context, cost)
    return VotingOutcome(
        context=fresh or context,
        label=context.labels[release.label_index],
        release=release,
        sigma=sigma,
        cost=cost,
        budget=status,
    )
