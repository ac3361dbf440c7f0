"""What the partition-and-aggregate mechanisms share (voting, ESA, and any variant of them):
the settings of T disjoint partitions, the checks of a new context and, for the Gaussian
ones, the calibration and the cost event.

A mechanism with other noise (a Laplace variant of voting, say) subclasses
:class:`PartitionedMechanism` and replaces :meth:`~PartitionedMechanism.calibrate` and
:meth:`~PartitionedMechanism.cost`.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dpicl.domain import (
    MAX_PARTITIONS,
    Delta,
    Epsilon,
    Int,
    OptionalInt,
)
from dpicl.errors import ConfigurationError
from dpicl.mechanisms.base import Mechanism, NewContext, Record
from dpicl.privacy.accounting import gaussian_mu2
from dpicl.privacy.calibration import epsilon_exact, sigma_for
from dpicl.privacy.ledger import Cost


class _Epsilon(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: Epsilon = Field(description="Per-query epsilon.")


class _Delta(_Epsilon):
    delta: Delta = Field(default=1e-5, description="Per-query delta.")


class PartitionedSettings(_Epsilon):
    """Settings shared by the partition-and-aggregate mechanisms: epsilon and T partitions
    (a pure epsilon-DP variant has no delta)."""

    partitions: Int = Field(
        default=10, ge=1, le=MAX_PARTITIONS, description="Number of disjoint partitions T <= |D|."
    )
    partition_seed: OptionalInt = Field(
        default=None, ge=0, lt=2**63, description="Seed of the partition permutation."
    )
    partitioning: Literal["positional", "hash"] = "positional"


class PartitionedGaussian(PartitionedSettings, _Delta):
    """Settings of the Gaussian partition-and-aggregate mechanisms (voting, ESA): epsilon,
    delta, the partitions, the calibration formula (fields in that order, as stored)."""

    calibration: Literal["classic", "analytic"] = "classic"


class PartitionedMechanism(Mechanism):
    """A mechanism over T disjoint partitions, budgeted by the request's ``budget``."""

    def check(self, settings: Any, new: NewContext) -> None:
        # Both schemes: hash partitioning leaves some partitions empty beyond |D|, and T is
        # the size of every answer's engine batch.
        if settings.partitions > new.n_exemplars:
            raise ConfigurationError(
                f"partitions T={settings.partitions} is larger than the number of exemplars "
                f"({new.n_exemplars})",
                param="mechanism.partitions",
            )
        if new.limits is None:  # a library caller is its own operator
            return
        if not new.budget_given:
            raise ConfigurationError(
                "budget is required: give budget {epsilon, delta}, or an explicit "
                '"budget": null where the server allows unbudgeted contexts',
                param="budget",
            )
        if new.budget is None and not new.limits.allow_unbudgeted:
            raise ConfigurationError(
                '"budget": null (a context that answers forever) is refused by this server; '
                "give budget {epsilon, delta} or set DPICL_ALLOW_UNBUDGETED=true",
                param="budget",
            )

    def sensitivity(self, settings: Any) -> float:
        """The L2 sensitivity of the aggregate the Gaussian noise covers."""
        raise NotImplementedError(f"{type(self).__name__} has no Gaussian sensitivity")

    def calibrate(self, settings: Any, n_exemplars: int) -> dict[str, Any]:
        """sigma for (epsilon, delta) at the mechanism's sensitivity, and the exact epsilon of
        one answer; a random partition seed when none was given."""
        seed = settings.partition_seed
        record: dict[str, Any] = settings.model_dump() | {
            "partition_seed": seed if seed is not None else secrets.randbits(63)
        }
        sensitivity = self.sensitivity(settings)
        sigma = sigma_for(settings.epsilon, settings.delta, sensitivity, settings.calibration)
        return record | {
            "sigma": sigma,
            "sensitivity": sensitivity,
            "epsilon_exact": epsilon_exact(sigma, sensitivity, settings.delta),
        }

    def cost(self, record: Record) -> Cost:
        return gaussian_cost(record)


def gaussian_cost(record: Record) -> Cost:
    """The cost event of one Gaussian answer: mu = Delta2 / sigma (dpicl.privacy.accounting)."""
    return Cost(
        epsilon=float(record["epsilon"]),
        delta=float(record["delta"]),
        epsilon_exact=record.get("epsilon_exact"),
        mu2=gaussian_mu2(float(record["sigma"]), float(record["sensitivity"])),
    )
