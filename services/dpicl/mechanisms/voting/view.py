"""What ``/v1/debug/classify`` shows of a private vote: the noise's own parameter, then the
noisy vote histogram; at ``internal`` also the clean histogram and each partition's vote.

The histogram's fields (:class:`VoteFields`) are shared by every voting variant; the noise's
parameter is each variant's own: Gaussian voting's ``sigma`` (:class:`VotingView`), while a
variant with other noise declares its own (the Laplace ``scale`` of
``examples/laplace_voting``) and claims no sigma. A view lists the noise model's base after
:class:`VoteFields`, so that the parameter comes first in the JSON, as it always has."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field


class VoteFields(BaseModel):
    """The vote histogram's white-box fields, whatever the noise."""

    noisy_votes: dict[str, float]
    clean_votes: dict[str, int] | None = None
    partition_votes: list[str | None] | None = Field(
        default=None, description="Each partition's vote; null where it abstained."
    )


class GaussianNoise(BaseModel):
    """The Gaussian noise's parameter."""

    sigma: float = Field(description="The noise's standard deviation on every count.")


class VotingView(VoteFields, GaussianNoise):
    """Private voting's white-box fields."""


def vote_fields(
    labels: Sequence[str],
    noisy: npt.NDArray[np.float64],
    internal: tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]] | None,
) -> VoteFields:
    """The histogram of one vote over ``labels``; ``internal``: (clean counts, partition
    votes), given at ``internal`` white-box access."""
    view = VoteFields(noisy_votes={lab: float(v) for lab, v in zip(labels, noisy, strict=True)})
    if internal is None:
        return view
    clean, votes = internal
    return view.model_copy(
        update={
            "clean_votes": {lab: int(v) for lab, v in zip(labels, clean, strict=True)},
            # None: the partition abstained (pipelines.votes.ABSTAIN).
            "partition_votes": [labels[v] if v >= 0 else None for v in map(int, votes)],
        }
    )


def voting_view(
    labels: Sequence[str],
    sigma: float,
    noisy: npt.NDArray[np.float64],
    internal: tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]] | None,
) -> VotingView:
    """The view of one Gaussian vote over ``labels`` (:func:`vote_fields`)."""
    return VotingView(sigma=sigma, **vote_fields(labels, noisy, internal).model_dump())
