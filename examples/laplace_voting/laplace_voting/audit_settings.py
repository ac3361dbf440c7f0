"""The audit settings of ``laplace-voting``: its own model, registered from outside.

Private voting with Laplace noise takes T partitions of ``shots`` exemplars and a vote
temperature, like voting, but no Gaussian calibration: the noise is ``Lap(b)`` on every
count with the scale ``b = 2 / epsilon`` (L1 sensitivity 2), pure epsilon-DP. ``delta`` is
only where the audit reads the exact epsilon of the design's signal (a pure-DP claim has
none). Registered as ``laplace-voting = "laplace_voting.audit_settings:LaplaceVotingSettings"``
in the group ``dpicl_audit.mechanisms``; this module imports no more of ``dpicl_audit`` than
the settings base, so that the plan can be assembled from it before any audit is imported.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from dpicl_audit.catalog.settings import PartitionedSettings

__all__ = ["CHANGED_COUNTS", "LaplaceVotingSettings", "laplace_scale"]

#: Counts one replaced exemplar changes (by 1 each): the L1 sensitivity of the histogram.
CHANGED_COUNTS = 2


def laplace_scale(epsilon: float) -> float:
    """The noise scale ``b = 2 / epsilon`` per count (L1 sensitivity 2)."""
    return CHANGED_COUNTS / float(epsilon)


class LaplaceVotingSettings(PartitionedSettings):
    """Private voting with ``Lap(2 / epsilon)`` on every count (pure epsilon-DP)."""

    audit: ClassVar[str] = "laplace_voting.audit:LAPLACE_VOTING"
    attacks: ClassVar[tuple[str, ...]] = ("inquery", "brainwash")
    #: Voting's pinned designs (the canary's partition decides): its audit builds and reads
    #: them as voting's, and the default (``design = "auto"``) takes them.
    inquery_designs: ClassVar[bool] = True

    name: Literal["laplace-voting"] = "laplace-voting"

    def scale(self, epsilon: float) -> float:
        """The Laplace scale a context at ``epsilon`` must report and draw with."""
        return laplace_scale(epsilon)

    def describe(self) -> str:
        return (
            f"{self.name}, T={self.partitions}, {self.shots} shots/partition, temperature "
            f"{self.temperature}, Laplace noise of scale 2/epsilon per count (pure DP), "
            f"exact epsilon read at delta={self.delta:g}"
        )
