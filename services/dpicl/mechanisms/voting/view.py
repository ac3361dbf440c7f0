"""What ``/v1/debug/classify`` shows of a private vote: the noisy vote histogram and the
noise's scale; at ``internal`` also the clean histogram and each partition's vote. Shared by
every voting variant (a variant with other noise adds its own scale)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field


class VotingView(BaseModel):
    """Private voting's white-box fields."""

    sigma: float = Field(description="The noise's standard deviation on every count.")
    noisy_votes: dict[str, float]
    clean_votes: dict[str, int] | None = None
    partition_votes: list[str | None] | None = Field(
        default=None, description="Each partition's vote; null where it abstained."
    )


def voting_view(
    labels: Sequence[str],
    sigma: float,
    noisy: npt.NDArray[np.float64],
    internal: tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]] | None,
) -> VotingView:
    """The view of one vote over ``labels``; ``internal``: (clean counts, partition votes),
    given at ``internal`` white-box access."""
    view = VotingView(
        sigma=sigma,
        noisy_votes={lab: float(v) for lab, v in zip(labels, noisy, strict=True)},
    )
    if internal is None:
        return view
    clean, votes = internal
    return view.model_copy(
        update={
            "clean_votes": {lab: int(v) for lab, v in zip(labels, clean, strict=True)},
            # None: the partition abstained (voting.release.ABSTAIN).
            "partition_votes": [labels[v] if v >= 0 else None for v in map(int, votes)],
        }
    )
