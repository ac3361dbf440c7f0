"""What a context is: its task, labels, exemplars, template, mechanism and budget.

These models are validated on construction and double as the request schemas of
``POST /v1/contexts``, so the OpenAPI document and the server agree by construction.
Every error names the offending value (pydantic reports its location as ``param``).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from dpicl.errors import ConfigurationError

Task = Literal["classification", "generation"]

DEFAULT_TEMPLATES: dict[str, str] = {
    "classification": (
        "Classify the input. Answer with exactly one of these labels: {labels}.\n\n"
        "{exemplars}\n\nInput: {query}\nLabel:"
    ),
    "generation": "Follow the examples.\n\n{exemplars}\n\nInput: {query}\nOutput:",
}


def _finite_positive(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a finite number > 0, got {value!r}")
    return value


def _open_unit(value: float) -> float:
    if not (0.0 < value < 1.0):
        raise ValueError(f"must lie in the open interval (0, 1), got {value!r}")
    return value


# Privacy parameters, validated wherever they appear (mechanisms and budgets alike).
Epsilon = Annotated[float, AfterValidator(_finite_positive)]
Delta = Annotated[float, AfterValidator(_open_unit)]


class Exemplar(BaseModel):
    """One private demonstration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Annotated[str, Field(min_length=1, max_length=20_000)]
    output: Annotated[str, Field(min_length=1, max_length=20_000)]


class _PartitionedGaussian(BaseModel):
    """Settings shared by the partition-and-aggregate Gaussian mechanisms (voting, ESA)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: Epsilon = Field(description="Per-query epsilon (> 0).")
    delta: Delta = Field(default=1e-5, description="Per-query delta, in (0, 1).")
    partitions: int = Field(default=10, ge=1, description="Number of disjoint partitions T.")
    partition_seed: int | None = Field(
        default=None, ge=0, lt=2**63, description="Seed of the partition permutation."
    )
    partitioning: Literal["positional", "hash"] = "positional"
    calibration: Literal["classic", "analytic"] = "classic"


class VotingSettings(_PartitionedGaussian):
    """Private voting (Algorithm 2 of Wu et al., as audited in paper 000)."""

    name: Literal["voting"] = "voting"
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)


class EsaSettings(_PartitionedGaussian):
    """Embedding space aggregation (Algorithm 3 of paper 000, Algorithm 4 of paper 004)."""

    name: Literal["esa"] = "esa"
    sensitivity: Literal["tight", "original"] = Field(
        default="tight",
        description="L2 sensitivity of the mean: 2/T (paper 000, Appendix A) or 1 (original).",
    )
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    candidates: int = Field(default=8, ge=1, le=64, description="Zero-shot candidates T_cand.")
    max_tokens: int = Field(default=48, ge=1, le=1024)


class MozoSettings(BaseModel):
    """DPS-MOZO (paper 004, Algorithm 1): per-token private decoding, budgeted in queries.

    ``epsilon`` and ``delta`` are the guarantee for the whole context: ``queries`` answers of
    at most ``max_tokens`` tokens each, calibrated once, at creation. ``guarantee: "proven"``
    (default) bounds each mixed distribution's max log-ratio to the zero-shot one by eps0,
    which makes the epsilon true (docs/privacy.md); ``"paper"`` is paper 004's Renyi
    constraint at (beta, alpha), whose epsilon is nominal (Theorem B.3 does not hold).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["dps-mozo"] = "dps-mozo"
    epsilon: Epsilon = Field(description="Total epsilon over all `queries` answers (> 0).")
    delta: Delta | None = Field(
        default=None, description="Total delta, in (0, 1); default 1/|D| (|D| exemplars)."
    )
    guarantee: Literal["proven", "paper"] = Field(
        default="proven",
        description="proven: max-log-ratio constraint, true (epsilon, delta); paper: paper "
        "004's Renyi constraint, nominal epsilon.",
    )
    alpha: int | None = Field(
        default=None,
        ge=2,
        le=1024,
        description="guarantee paper only: Renyi order; default: the smallest whose "
        "RDP-to-DP conversion costs at most epsilon/2 (paper 004, Section 5.1).",
    )
    n_shots: int = Field(default=4, ge=1, le=1024, description="Exemplars sampled per token.")
    top_k: int = Field(default=100, ge=1, le=1000, description="Zero-shot top-k support.")
    max_tokens: int = Field(default=48, ge=1, le=1024, description="T_max per answer.")
    queries: int = Field(ge=1, le=1_000_000, description="Answers the context will give.")
    lambda_max: float = Field(default=1.5, ge=0.0, le=10.0, description="Upper end of lambda.")

    def resolved_delta(self, n_exemplars: int) -> float:
        return self.delta if self.delta is not None else 1.0 / n_exemplars


class PublicSettings(BaseModel):
    """Ordinary few-shot ICL over public (e.g. DP-synthesised) exemplars: no privacy cost.

    Not accepted by ``POST /v1/contexts``: such contexts are only derived by
    ``POST /v1/contexts/{id}/synthesize`` (DPS-MOZO offline mode), so private exemplars can
    never be served without a DP mechanism by mistake.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["public"] = "public"
    max_tokens: int = Field(default=48, ge=1, le=1024)
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    derived_from: str | None = None


MechanismSettings = Annotated[
    VotingSettings | EsaSettings | MozoSettings, Field(discriminator="name")
]


class BudgetSpec(BaseModel):
    """Total (epsilon, delta) a context may spend over all its answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: Epsilon
    delta: Delta


class ContextSpec(BaseModel):
    """The body of ``POST /v1/contexts``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(max_length=200)] | None = None
    task: Task = "classification"
    labels: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list)
    exemplars: list[Exemplar] = Field(min_length=1)
    template: Annotated[str, Field(max_length=20_000)] | None = None
    mechanism: MechanismSettings
    budget: BudgetSpec | None = None

    def check(self) -> None:
        """Cross-field checks; raise :class:`ConfigurationError` naming the bad value."""
        wanted = {"voting": "classification", "esa": "generation", "dps-mozo": "generation"}[
            self.mechanism.name
        ]
        if self.task != wanted:
            raise ConfigurationError(
                f"mechanism {self.mechanism.name!r} serves {wanted} contexts, "
                f"not task {self.task!r}",
                param="task",
            )
        if self.task == "classification":
            if len(self.labels) < 2:
                raise ConfigurationError(
                    f"a classification context needs at least 2 labels, got {self.labels!r}",
                    param="labels",
                )
            if len(set(self.labels)) != len(self.labels):
                raise ConfigurationError(
                    f"labels must be distinct, got {self.labels!r}", param="labels"
                )
            for i, e in enumerate(self.exemplars):
                if e.output not in self.labels:
                    raise ConfigurationError(
                        f"exemplar output {e.output!r} is not one of the labels {self.labels!r}",
                        param=f"exemplars.{i}.output",
                    )
        if self.template is not None:
            for slot in ("{exemplars}", "{query}"):
                if slot not in self.template:
                    raise ConfigurationError(
                        f"the template must contain the slot {slot}", param="template"
                    )
        mech = self.mechanism
        if isinstance(mech, MozoSettings):
            self._check_mozo(mech)
            return
        if mech.partitioning == "positional" and mech.partitions > len(self.exemplars):
            raise ConfigurationError(
                f"partitions T={mech.partitions} is larger than the number of exemplars "
                f"({len(self.exemplars)})",
                param="mechanism.partitions",
            )

    def _check_mozo(self, mech: MozoSettings) -> None:
        n = len(self.exemplars)
        if mech.n_shots > n:
            raise ConfigurationError(
                f"n_shots={mech.n_shots} is larger than the number of exemplars ({n})",
                param="mechanism.n_shots",
            )
        if mech.guarantee == "proven" and mech.alpha is not None:
            raise ConfigurationError(
                f"alpha={mech.alpha} only applies to guarantee 'paper'; the proven mode "
                "has no Renyi order",
                param="mechanism.alpha",
            )
        if mech.delta is None and n < 2:
            raise ConfigurationError(
                f"the default delta 1/|D| needs at least 2 exemplars, got {n}; give delta",
                param="mechanism.delta",
            )
        if self.budget is not None:
            raise ConfigurationError(
                "a dps-mozo context is budgeted by mechanism.epsilon over mechanism.queries "
                f"answers; omit budget (got {self.budget.model_dump()!r})",
                param="budget",
            )

    def resolved_template(self) -> str:
        return self.template if self.template is not None else DEFAULT_TEMPLATES[self.task]
