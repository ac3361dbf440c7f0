"""What the partition-and-aggregate mechanisms share (voting, ESA, and any variant of them):
the settings of T disjoint partitions, the checks of a new context, the calibration records
and, for the Gaussian ones, the calibration and the cost event.

A mechanism with other noise (a Laplace variant of voting, say) subclasses
:class:`PartitionedMechanism` with a calibration of its own (a
:class:`PartitionedCalibration`) and replaces :meth:`~PartitionedMechanism.calibrate` and
:meth:`~PartitionedMechanism.cost`.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from dpicl.domain import (
    MAX_PARTITIONS,
    Delta,
    Epsilon,
    Int,
    OptionalInt,
)
from dpicl.errors import ConfigurationError
from dpicl.mechanisms.base import Mechanism, NewContext
from dpicl.pipelines.partitions import PartitionLayout
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


class _EpsilonRecord(BaseModel):
    # A stored record is read as it was stored: no bounds (a server's limits may have
    # changed since), other fields ignored.
    model_config = ConfigDict(frozen=True, extra="ignore")

    epsilon: float


class _DeltaRecord(_EpsilonRecord):
    delta: float


class PartitionedCalibration(PartitionLayout, _EpsilonRecord):
    """The stored record of a partition-and-aggregate mechanism begins with its epsilon and
    its partition layout (fields in the order :class:`PartitionedSettings` dumps them); a
    mechanism's calibration extends it with its own settings and derived values."""


class GaussianCalibration(PartitionedCalibration, _DeltaRecord):
    """The record of a Gaussian partition-and-aggregate mechanism up to its own settings:
    epsilon, delta, the layout, the calibration formula. Its calibration adds ``name``, its
    settings and the derived ``sigma``, ``sensitivity`` and ``epsilon_exact`` (in the order
    the mechanism's record stores them)."""

    # Never read by an answer (sigma is stored): a record without it was calibrated by the
    # classic formula, the only one there was.
    calibration: Literal["classic", "analytic"] = "classic"


class GaussianRecord(Protocol):
    """What the Gaussian cost event reads of a calibration."""

    @property
    def epsilon(self) -> float: ...
    @property
    def delta(self) -> float: ...
    @property
    def sigma(self) -> float: ...
    @property
    def sensitivity(self) -> float: ...
    @property
    def epsilon_exact(self) -> float | None: ...


P = TypeVar("P", bound=PartitionedCalibration)


class PartitionedMechanism(Mechanism[P]):
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


def partition_seed(settings: PartitionedSettings) -> int:
    """The settings' partition seed, or a random one when none was given."""
    seed = settings.partition_seed
    return seed if seed is not None else secrets.randbits(63)


class GaussianMechanism(PartitionedMechanism[P]):
    """A partition-and-aggregate mechanism with Gaussian noise, calibrated to (epsilon,
    delta) at its :meth:`sensitivity`; its ``cost`` is :func:`gaussian_cost` of its
    calibration (a :class:`GaussianRecord`)."""

    def sensitivity(self, settings: Any) -> float:
        """The L2 sensitivity of the aggregate the Gaussian noise covers."""
        raise NotImplementedError(f"{type(self).__name__} has no Gaussian sensitivity")

    def calibrate(self, settings: Any, n_exemplars: int) -> P:
        """sigma for (epsilon, delta) at the mechanism's sensitivity, and the exact epsilon of
        one answer; a random partition seed when none was given."""
        sensitivity = self.sensitivity(settings)
        sigma = sigma_for(settings.epsilon, settings.delta, sensitivity, settings.calibration)
        return self.calibration(
            **settings.model_dump()
            | {
                "partition_seed": partition_seed(settings),
                "sigma": sigma,
                "sensitivity": sensitivity,
                "epsilon_exact": epsilon_exact(sigma, sensitivity, settings.delta),
            }
        )


def gaussian_cost(cal: GaussianRecord) -> Cost:
    """The cost event of one Gaussian answer: mu = Delta2 / sigma (dpicl.privacy.accounting)."""
    return Cost(
        epsilon=cal.epsilon,
        delta=cal.delta,
        epsilon_exact=cal.epsilon_exact,
        mu2=gaussian_mu2(cal.sigma, cal.sensitivity),
    )
