"""Private voting's audit settings: T partitions, the Gaussian noise's calibration."""

from __future__ import annotations

from typing import ClassVar, Literal, Self

from dpicl_audit.catalog.settings import GaussianSettings

__all__ = ["VotingSettings"]


class VotingSettings(GaussianSettings):
    """Private voting (paper 000, Algorithm 2): Gaussian noise on the T partitions' votes."""

    audit: ClassVar[str] = "dpicl_audit.mechanisms.voting.audit:VOTING"
    task: ClassVar[str | None] = "classification"
    attacks: ClassVar[tuple[str, ...]] = (
        "inquery",
        "brainwash",
        # paper 003's adversaries (RDP audits of query sequences: .rdp)
        "nat-advq",
        "pois-advq",
        "pois-natq-confident",
        "pois-natq-unconfident",
        "pois-natq-all-same",
        "pois-natq-mapping",
    )
    settings: ClassVar[tuple[str, ...]] = ("audit-template", "deployment")
    inquery_designs: ClassVar[bool] = True

    name: Literal["voting"] = "voting"

    def tail_gap(self, epsilon: float, partitions: int) -> Self | None:
        return self.model_copy(
            update={"epsilons": (epsilon,), "partitions": partitions, "shots": 1}
        )
