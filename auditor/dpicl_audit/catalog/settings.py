"""What every mechanism's audit settings (the plan's ``[mechanism]`` section) share.

Each mechanism's folder holds its settings model (``voting/settings.py``, ...; a mechanism
registered from outside ships its own), a subclass of :class:`MechanismSettings` whose
``name`` is a ``Literal``: the plan's section is the union of the registered models,
discriminated on ``name`` (:mod:`.catalog`). A model also declares, as class attributes,
what the core asks of a mechanism without naming it: the attacks it takes, the settings
(audit template, deployment) and neighbour designs it supports, the plan defaults it
changes, and where its audit is. Its :meth:`~MechanismSettings.check_plan` holds the plan
checks that depend on the mechanism.

This module imports nothing of the package but :mod:`dpicl_audit.errors`, so that the plan
can be assembled from the models without importing the audits (which import the plan).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "FLAT_FIELDS",
    "FROZEN",
    "Calibration",
    "GaussianSettings",
    "MechanismSettings",
    "PartitionedSettings",
    "PlanView",
]

FROZEN = ConfigDict(frozen=True, extra="forbid")
#: How a Gaussian mechanism's sigma is calibrated to (epsilon, delta).
Calibration = Literal["classic", "analytic"]

#: The fields of the one flat ``[mechanism]`` section every plan had before the sections
#: were per mechanism (issue 38). A stored plan, a TOML file or a flag may still carry one
#: that its mechanism does not take: it is dropped (as the flat section ignored it), while a
#: field no mechanism ever had is an error.
FLAT_FIELDS = frozenset(
    {
        "name", "epsilons", "delta", "partitions", "shots", "temperature", "calibration",
        "sensitivity", "candidates", "max_tokens", "exemplars", "n_shots", "top_k",
        "guarantee", "alpha", "queries_per_context",
    }
)  # fmt: skip


class PlanView(Protocol):
    """The parts of an audit plan a mechanism's :meth:`~MechanismSettings.check_plan` reads
    (the plan is above this module: it is passed in, not imported)."""

    @property
    def attack(self) -> str: ...

    @property
    def setting(self) -> str: ...

    @property
    def design(self) -> str: ...


class MechanismSettings(BaseModel):
    """The settings every mechanism's audit takes: its name, the epsilons audited, delta."""

    model_config = FROZEN

    #: Where the audit is (``"module:ATTRIBUTE"``, as an entry point names it): the registry
    #: loads the built-in audits from their settings, as it loads a registered one.
    audit: ClassVar[str]
    #: The server context's task (``classification`` or ``generation``), where the mechanism
    #: declares it: what a plan of that task audits by default (the utility audit's cells).
    task: ClassVar[str | None] = None
    #: The attacks this mechanism takes (names of :data:`dpicl_audit.catalog.attacks.ATTACKS`).
    attacks: ClassVar[tuple[str, ...]] = ("inquery",)
    #: The plan settings (``setting``) its audit supports.
    settings: ClassVar[tuple[str, ...]] = ("audit-template",)
    #: Whether the inquery designs ``pivotal`` and ``identical`` exist for it.
    inquery_designs: ClassVar[bool] = False
    #: Plan fields whose default differs for this mechanism (``dataset``).
    plan_defaults: ClassVar[Mapping[str, object]] = {}
    #: Values a plan stored by an older auditor meant where it has none.
    stored_defaults: ClassVar[Mapping[str, object]] = {}

    name: str
    epsilons: tuple[float, ...] = Field(default=(1.0, 2.0, 4.0, 8.0), min_length=1)
    delta: float = 1e-5

    @model_validator(mode="before")
    @classmethod
    def _drop_flat_fields(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        return {k: v for k, v in data.items() if k in cls.model_fields or k not in FLAT_FIELDS}

    @field_validator("epsilons")
    @classmethod
    def _eps(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        for e in v:
            if not math.isfinite(e) or e <= 0:
                raise ValueError(f"every epsilon must be a finite number > 0, got {e!r}")
        if len(set(v)) != len(v):
            raise ValueError(f"epsilons must be distinct, got {list(v)!r}")
        return tuple(float(e) for e in v)

    @field_validator("delta")
    @classmethod
    def _delta(cls, v: float) -> float:
        if not 0.0 < v < 1.0:
            raise ValueError(f"delta must lie in the open interval (0, 1), got {v!r}")
        return v

    @classmethod
    def of(cls, plan: Any) -> Self:
        """``plan``'s mechanism section, which must be of this model (an audit reads its
        own fields through it): ``TypeError`` where the plan audits another mechanism."""
        mech = plan.mechanism
        if not isinstance(mech, cls):
            raise TypeError(f"the plan audits {mech.name!r}, not a {cls.__name__}")
        return mech

    @property
    def n_exemplars(self) -> int:
        """The context's size in exemplars."""
        raise NotImplementedError

    @property
    def answer_tokens(self) -> int | None:
        """Tokens per generated answer; None for a classification mechanism."""
        return None

    def check_plan(self, plan: PlanView) -> None:
        """Raise ``ValueError`` (a plan error) where ``plan`` asks what this mechanism's
        audit does not do. Subclasses extend it with checks of their own settings."""
        if plan.design in ("pivotal", "identical") and not (
            self.inquery_designs and plan.attack == "inquery" and plan.setting == "audit-template"
        ):
            raise ValueError(
                f"design {plan.design!r} is a voting or ESA inquery design in the audit template; "
                f"this plan audits {self.name} with attack {plan.attack!r} in {plan.setting!r}"
            )
        if plan.setting not in self.settings:
            raise ValueError(
                f"{self.name} audits support only setting = "
                + " or ".join(repr(s) for s in self.settings)
            )

    def tail_gap(self, epsilon: float, partitions: int) -> Self | None:
        """These settings for ``--profile verify``'s tail-gap run (one epsilon, ``partitions``
        of one shot each); None where the mechanism has no such run."""
        return None

    def describe(self) -> str:
        """The report's one line on these settings."""
        return f"{self.name}, delta={self.delta:g}"

    def design_text(self, plan: Any) -> str | None:
        """The report table's design column where the mechanism names it (None: the
        plan's canary and setting)."""
        return None


class PartitionedSettings(MechanismSettings):
    """A mechanism over T disjoint partitions of ``shots`` exemplars each."""

    partitions: int = Field(default=4, ge=1, le=1000, description="T, disjoint partitions.")
    shots: int = Field(default=2, ge=1, le=100, description="Exemplars per partition.")
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)

    @property
    def n_exemplars(self) -> int:
        """Context size: T partitions of ``shots`` exemplars each."""
        return self.partitions * self.shots

    def describe(self) -> str:
        return (
            f"{self.name}, T={self.partitions}, {self.shots} shots/partition, temperature "
            f"{self.temperature}, delta={self.delta:g}"
        )


class GaussianSettings(PartitionedSettings):
    """A partitioned mechanism with Gaussian noise calibrated to (epsilon, delta)."""

    calibration: Calibration = "classic"

    def describe(self) -> str:
        return f"{super().describe()}, calibration {self.calibration}"
