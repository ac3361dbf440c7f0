"""Private voting as the server serves it: its settings (the schema fragment of
``POST /v1/contexts``), calibration and cost event (Gaussian, :mod:`~dpicl.mechanisms.
partitioned`), pipeline (:mod:`.pipeline`) and white-box view."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from dpicl.domain import Float
from dpicl.mechanisms.base import Answering, Outcome
from dpicl.mechanisms.partitioned import PartitionedGaussian, PartitionedMechanism
from dpicl.mechanisms.voting.pipeline import VotingOutcome, run_voting
from dpicl.mechanisms.voting.release import VOTING_SENSITIVITY
from dpicl.store.repository import StoredContext


class VotingSettings(PartitionedGaussian):
    """Private voting (Algorithm 2 of Wu et al., as audited in paper 000)."""

    name: Literal["voting"] = "voting"
    temperature: Float = Field(default=0.0, ge=0.0, le=10.0)


class Voting(PartitionedMechanism):
    """Noisy argmax of the T partitions' vote histogram (paper 000, Algorithm 2)."""

    name = "voting"
    task = "classification"
    settings = VotingSettings

    def sensitivity(self, settings: Any) -> float:
        return VOTING_SENSITIVITY

    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        return await run_voting(
            context, query, engine=how.runtime.engine, ledger=how.ledger, rng=how.rng
        )

    def debug_view(self, outcome: Any, whitebox: str) -> dict[str, Any] | None:
        """The noisy votes and sigma; at ``internal`` also the clean votes and each
        partition's vote."""
        out: VotingOutcome = outcome
        labels = out.context.labels
        rel = out.release
        body: dict[str, Any] = {
            "sigma": out.sigma,
            "noisy_votes": {lab: float(v) for lab, v in zip(labels, rel.noisy_counts, strict=True)},
        }
        if whitebox == "internal":
            body["clean_votes"] = {
                lab: int(v) for lab, v in zip(labels, rel.clean_counts, strict=True)
            }
            # None: the partition abstained (unusable scores; voting.release.ABSTAIN).
            body["partition_votes"] = [
                labels[v] if v >= 0 else None for v in map(int, rel.partition_votes)
            ]
        return body


VOTING = Voting()
