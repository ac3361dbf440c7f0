"""Private voting (Algorithm 2 of paper 000) as a request pipeline.

query -> T partition prompts (one engine batch) -> label scores -> per-partition votes ->
Gaussian-noised histogram -> noisy argmax. The ledger is charged before the engine runs and
refunded if the engine fails, so a failure costs nothing and no answer escapes unpaid.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpicl.engines.base import Engine
from dpicl.mechanisms.partitioned import GaussianCalibration, gaussian_cost
from dpicl.mechanisms.voting.exemplar_calibration import (
    EXEMPLAR_BIASES,
    biases_from_scores,
    exemplar_prompts,
)
from dpicl.mechanisms.voting.release import VotingRelease, private_vote
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.pipelines.partitions import partition_prompts
from dpicl.pipelines.votes import (
    ABSTAIN,
    CONTENT_FREE,
    content_free_calibrated,
    exemplar_calibrated,
)
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.store.repository import StoredContext

log = logging.getLogger("dpicl.pipelines")


class VotingCalibration(GaussianCalibration):
    """A voting context's stored record, typed (its fields in the order stored)."""

    name: Literal["voting"] = "voting"
    temperature: float
    sigma: float
    sensitivity: float
    epsilon_exact: float | None = None
    label_calibration: str = "none"


@dataclass(frozen=True, slots=True)
class VotingOutcome:
    context: StoredContext
    label: str
    release: VotingRelease
    sigma: float
    cost: Cost
    budget: BudgetStatus

    @property
    def text(self) -> str:
        return self.label

    finish_reason: Literal["stop", "length"] = "stop"
    completion_tokens: int = 0


async def paid_scores(
    context: StoredContext,
    query: str,
    cost: Cost,
    *,
    engine: Engine,
    ledger: Ledger,
    label_calibration: str = "none",
) -> tuple[StoredContext, npt.NDArray[np.float64]]:
    """Charge ``cost``, then score every label in each of the T partition prompts (one
    engine batch): the context after the charge and the (T, L) log-likelihoods. Shared by
    every voting variant (refunded if the engine fails, like every paid call).

    ``label_calibration="content-free"``: contextual calibration (Zhao et al. 2021). Each
    partition's prompt is scored for the query and for :data:`CONTENT_FREE` (the same
    batch), and its scores become log p(label | query) - log p(label | "N/A"), each
    normalised over the labels: the label probabilities divided by the content-free ones.
    Partition t's calibrated scores depend on partition t's exemplars and public text only,
    so its vote does too, and the histogram's sensitivity is unchanged.

    ``label_calibration="exemplars"``: batch calibration (Zhou et al. 2024) with partition
    t's own exemplar inputs as the batch (:mod:`.exemplar_calibration`): log p(label |
    query) minus the mean log p(label | exemplar input) under partition t's prompt. The same
    argument holds (the bias is partition t's alone); the biases are scored once per context,
    in the first paid batch that needs them, then cached."""
    prompts = partition_prompts(context, query)
    t = len(prompts)
    biases = None
    sizes: list[int] = []
    if label_calibration == "content-free":
        prompts = prompts + partition_prompts(context, CONTENT_FREE)
    elif label_calibration == "exemplars":
        biases = EXEMPLAR_BIASES.get(context, engine)
        if biases is None:
            sizes, extra = exemplar_prompts(context)
            prompts = prompts + extra
    charged, scores = await paid_engine_call(
        ledger, context, cost, engine.name, engine.score_labels(prompts, context.labels)
    )
    out = np.asarray(scores, dtype=np.float64)
    if label_calibration == "content-free":
        return charged, content_free_calibrated(out[:t], out[t:])
    if label_calibration == "exemplars":
        if biases is None:
            biases = biases_from_scores(sizes, out[t:])
            EXEMPLAR_BIASES.put(context, engine, biases)
        return charged, exemplar_calibrated(out[:t], biases)
    return charged, out


def warn_abstained(partition_votes: npt.NDArray[np.int64], context: StoredContext) -> None:
    """Tell the operator (the server log, never the client) how many partitions abstained."""
    abstained = int((partition_votes == ABSTAIN).sum())
    if abstained:
        # The answer stands (an abstaining partition keeps the sensitivity); the operator
        # should still hear that the model's numerics failed.
        log.warning(
            "%d of %d partitions of context %s abstained: their label scores were not usable",
            abstained,
            partition_votes.size,
            context.id,
        )


async def run_voting(
    context: StoredContext,
    query: str,
    *,
    engine: Engine,
    ledger: Ledger,
    rng: np.random.Generator,
) -> VotingOutcome:
    """One private vote on ``context``, by its calibration (parsed once per context)."""
    cal = context.record_as(VotingCalibration)
    cost = gaussian_cost(cal)
    charged, scores = await paid_scores(
        context, query, cost, engine=engine, ledger=ledger, label_calibration=cal.label_calibration
    )
    release = private_vote(scores, cal.sigma, cal.temperature, rng)
    warn_abstained(release.partition_votes, context)
    return VotingOutcome(
        context=charged,
        label=context.labels[release.label_index],
        release=release,
        sigma=cal.sigma,
        cost=cost,
        budget=Ledger.status(charged, cost),
    )
