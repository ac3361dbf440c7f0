"""Private voting (Algorithm 2 of paper 000) as a request pipeline.

query -> T partition prompts (one engine batch) -> label scores -> per-partition votes ->
Gaussian-noised histogram -> noisy argmax. The ledger is charged before the engine runs and
refunded if the engine fails, so a failure costs nothing and no answer escapes unpaid.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from dpicl.engines.base import Engine
from dpicl.mechanisms.voting import ABSTAIN, VotingRelease, private_vote
from dpicl.pipelines.contexts import cost_of
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.pipelines.partitions import partition_prompts
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.store.repository import StoredContext

log = logging.getLogger("dpicl.pipelines")


@dataclass(frozen=True, slots=True)
class VotingOutcome:
    context: StoredContext
    label: str
    release: VotingRelease
    sigma: float
    cost: Cost
    budget: BudgetStatus


async def run_voting(
    context: StoredContext,
    query: str,
    *,
    engine: Engine,
    ledger: Ledger,
    rng: np.random.Generator,
) -> VotingOutcome:
    prompts = partition_prompts(context, query)
    cost = cost_of(context)
    charged, scores = await paid_engine_call(
        ledger, context, cost, engine.name, engine.score_labels(prompts, context.labels)
    )
    sigma = float(context.mechanism["sigma"])
    release = private_vote(
        np.asarray(scores, dtype=np.float64),
        sigma,
        float(context.mechanism["temperature"]),
        rng,
    )
    abstained = int((release.partition_votes == ABSTAIN).sum())
    if abstained:
        # The answer stands (an abstaining partition keeps the sensitivity); the operator
        # should still hear that the model's numerics failed. The count goes to the server
        # log only, like the other internals, never to the client.
        log.warning(
            "%d of %d partitions of context %s abstained: their label scores were not usable",
            abstained,
            release.partition_votes.size,
            context.id,
        )
    return VotingOutcome(
        context=charged,
        label=context.labels[release.label_index],
        release=release,
        sigma=sigma,
        cost=cost,
        budget=Ledger.status(charged, cost),
    )
