"""Private voting as the server serves it: its settings (the schema fragment of
``POST /v1/contexts``), calibration and cost event (Gaussian, :mod:`~dpicl.mechanisms.
partitioned`), pipeline (:mod:`.pipeline`) and white-box view."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from dpicl.domain import Float
from dpicl.mechanisms.base import Answering, Outcome
from dpicl.mechanisms.partitioned import (
    GaussianMechanism,
    PartitionedGaussian,
    gaussian_cost,
)
from dpicl.mechanisms.voting.pipeline import VotingCalibration, VotingOutcome, run_voting
from dpicl.mechanisms.voting.release import VOTING_SENSITIVITY
from dpicl.mechanisms.voting.view import VotingView, voting_view
from dpicl.privacy.ledger import Cost
from dpicl.store.repository import StoredContext


class VotingSettings(PartitionedGaussian):
    """Private voting (Algorithm 2 of Wu et al., as audited in paper 000)."""

    name: Literal["voting"] = "voting"
    temperature: Float = Field(default=0.0, ge=0.0, le=10.0)
    label_calibration: Literal["none", "content-free", "exemplars"] = Field(
        default="none",
        description="content-free: contextual calibration (Zhao et al. 2021) of each "
        "partition's label scores: its label probabilities divided by those of the content-"
        "free input 'N/A' under the same partition's exemplars, before the partition votes; "
        "it doubles the prompts of an answer. exemplars: batch calibration (Zhou et al. "
        "2024) with the partition's own exemplars as the batch: divided by the mean label "
        "distribution of the partition's exemplar inputs, each asked under the partition's "
        "prompt; scored once per context (the first answer asks the k exemplar prompts "
        "too), then cached. Either uses that partition's exemplars only, so the guarantee "
        "is unchanged. The zero-shot baseline has no exemplars: under exemplars it is "
        "uncalibrated.",
    )


class Voting(GaussianMechanism[VotingCalibration]):
    """Noisy argmax of the T partitions' vote histogram (paper 000, Algorithm 2)."""

    name = "voting"
    task = "classification"
    settings = VotingSettings
    calibration = VotingCalibration
    debug_model = VotingView

    def sensitivity(self, settings: Any) -> float:
        return VOTING_SENSITIVITY

    def cost(self, calibration: VotingCalibration) -> Cost:
        return gaussian_cost(calibration)

    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        return await run_voting(
            context, query, engine=how.runtime.engine, ledger=how.ledger, rng=how.rng
        )

    def debug_view(self, outcome: Any, whitebox: str) -> VotingView:
        """The noisy votes and sigma; at ``internal`` also the clean votes and each
        partition's vote."""
        out: VotingOutcome = outcome
        rel = out.release
        return voting_view(
            out.context.labels,
            out.sigma,
            rel.noisy_counts,
            (rel.clean_counts, rel.partition_votes) if whitebox == "internal" else None,
        )


VOTING = Voting()
