"""The server half of ``laplace-voting``: private voting with Laplace noise, written against
:mod:`dpicl.mechanisms.registry`'s protocol from outside the ``dpicl`` package.

Each of the T partitions votes for a label, as in private voting (paper 000, Algorithm 2),
and the released label is the noisy argmax of the vote histogram with Lap(b) noise on
every count, ties broken uniformly at random.

* Sensitivity: replacing one exemplar changes one partition, which moves its vote from one
  label to another: one count falls by 1 and one rises by 1, so Delta1 = 2.
* Calibration: b = Delta1 / epsilon makes the noisy histogram (hence its argmax) pure
  epsilon-DP (Dwork and Roth 2014, Theorem 3.6).
* Cost event: pure epsilon-DP, converted to mu-GDP by
  :func:`dpicl.privacy.accounting.pure_dp_mu2` (mu = 2 Phi^-1(e^eps / (1 + e^eps)),
  exact for randomized response, conservative otherwise), so the ledger admits it in mu^2
  like every answer; the spent epsilon reported at the budget's delta is the smaller of
  the composed GDP curve's and n epsilon (basic composition). A context therefore needs a
  budget {epsilon, delta}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field

from dpicl.domain import Float
from dpicl.errors import ConfigurationError
from dpicl.mechanisms.base import Answering, NewContext, Outcome
from dpicl.mechanisms.partitioned import (
    PartitionedCalibration,
    PartitionedMechanism,
    PartitionedSettings,
    partition_seed,
)
from dpicl.mechanisms.voting.pipeline import paid_scores, warn_abstained
from dpicl.mechanisms.voting.release import vote_histogram
from dpicl.mechanisms.voting.view import VoteFields, vote_fields
from dpicl.pipelines.votes import partition_votes
from dpicl.privacy.accounting import pure_dp_mu2
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.store.repository import StoredContext

#: L1 sensitivity of the vote histogram under replace-one adjacency.
L1_SENSITIVITY = 2.0


class LaplaceVotingSettings(PartitionedSettings):
    """Private voting with Laplace noise of scale 2/epsilon on every count (pure DP)."""

    name: Literal["laplace-voting"] = "laplace-voting"
    temperature: Float = Field(default=0.0, ge=0.0, le=10.0)


class LaplaceCalibration(PartitionedCalibration):
    """A laplace-voting context's stored record: epsilon, the partition layout, the
    settings, then the Laplace scale b = Delta1 / epsilon and what the server's reports read
    (``sensitivity``, ``delta`` 0, ``epsilon_exact``)."""

    name: Literal["laplace-voting"] = "laplace-voting"
    temperature: float
    scale: float
    sensitivity: float
    delta: float
    epsilon_exact: float


class LaplaceNoise(BaseModel):
    """The Laplace noise's parameter (no Gaussian sigma: this noise has none)."""

    scale: float = Field(description="The Laplace noise's scale b on every count.")


class LaplaceView(VoteFields, LaplaceNoise):
    """The Laplace ``scale``, then the vote histogram's fields as every voting variant's."""


def laplace_vote(
    scores: npt.NDArray[np.float64], scale: float, temperature: float, rng: np.random.Generator
) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(label index, partition votes, clean counts, noisy counts) from (T, L) label scores."""
    votes = partition_votes(scores, temperature, rng)
    clean = vote_histogram(votes, scores.shape[1])
    noisy = clean + rng.laplace(0.0, scale, size=clean.shape)
    best = np.flatnonzero(noisy == noisy.max())  # ties: uniformly at random, never by index
    return int(rng.choice(best)), votes, clean, noisy


@dataclass(frozen=True, slots=True)
class LaplaceOutcome:
    context: StoredContext
    label: str
    scale: float
    partition_votes: npt.NDArray[np.int64]
    clean_counts: npt.NDArray[np.float64]
    noisy_counts: npt.NDArray[np.float64]
    cost: Cost
    budget: BudgetStatus
    finish_reason: Literal["stop", "length"] = "stop"
    completion_tokens: int = 0

    @property
    def text(self) -> str:
        return self.label


class LaplaceVoting(PartitionedMechanism[LaplaceCalibration]):
    """Noisy argmax of the partitions' vote histogram under Laplace noise."""

    name = "laplace-voting"
    task = "classification"
    settings = LaplaceVotingSettings
    calibration = LaplaceCalibration
    debug_model = LaplaceView

    def check(self, settings: Any, new: NewContext) -> None:
        super().check(settings, new)
        if new.budget is None:
            raise ConfigurationError(
                "a laplace-voting context needs budget {epsilon, delta}: its answers compose "
                "in mu^2 and the spent epsilon is reported at the budget's delta",
                param="budget",
            )

    def calibrate(self, settings: Any, n_exemplars: int) -> LaplaceCalibration:
        return LaplaceCalibration(
            **settings.model_dump()
            | {
                "partition_seed": partition_seed(settings),
                "scale": L1_SENSITIVITY / settings.epsilon,
                "sensitivity": L1_SENSITIVITY,
                "delta": 0.0,
                "epsilon_exact": settings.epsilon,
            }
        )

    def cost(self, calibration: LaplaceCalibration) -> Cost:
        eps = calibration.epsilon
        return Cost(
            epsilon=eps, delta=0.0, epsilon_exact=eps, mu2=pure_dp_mu2(eps), pure_epsilon=eps
        )

    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        cal = self.calibration_of(context)
        cost = self.cost(cal)
        charged, scores = await paid_scores(
            context, query, cost, engine=how.runtime.engine, ledger=how.ledger
        )
        scale = cal.scale
        index, votes, clean, noisy = laplace_vote(scores, scale, cal.temperature, how.rng)
        warn_abstained(votes, context)
        return LaplaceOutcome(
            context=charged,
            label=context.labels[index],
            scale=scale,
            partition_votes=votes,
            clean_counts=clean,
            noisy_counts=noisy,
            cost=cost,
            budget=Ledger.status(charged, cost),
        )

    def debug_view(self, outcome: Any, whitebox: str) -> LaplaceView:
        """The Laplace scale and the noisy votes; at ``internal`` also the clean votes and
        each partition's vote."""
        out: LaplaceOutcome = outcome
        internal = (out.clean_counts, out.partition_votes) if whitebox == "internal" else None
        votes = vote_fields(out.context.labels, out.noisy_counts, internal)
        return LaplaceView(scale=out.scale, **votes.model_dump())


#: The entry point's object: ``laplace-voting = "laplace_voting.server:LAPLACE_VOTING"``.
LAPLACE_VOTING = LaplaceVoting()
