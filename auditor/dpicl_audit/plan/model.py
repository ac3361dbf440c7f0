"""Audit plans: everything one audit needs (any mechanism), validated once.

A plan is a frozen pydantic model. It comes from a TOML file (:meth:`AuditPlan.from_toml`),
from CLI flags (:meth:`AuditPlan.from_sources`, flags override the file), or from the JSON
stored with a run (:meth:`AuditPlan.model_validate`). Tokens are :class:`~pydantic.SecretStr`
and are never written to the trial log: :meth:`AuditPlan.public_dump` masks them, and a
resumed run takes them from flags or the environment again.

Where plans come from (a TOML file, CLI flags on top of it, the JSON stored with a run) and
the TOML layout are :mod:`dpicl_audit.plan.sources`'s (data in, data out); the classmethods
here validate what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from dpicl_audit.catalog.attacks import Attack, check_attack
from dpicl_audit.catalog.mechanisms import mechanism_names, settings_for
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.estimators.held_out import DEFAULT_SELECTION_FRACTION
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.plan.sources import MASK, plan_data_from_sources, public_plan_data
from dpicl_audit.plan.specs import (
    FROZEN,
    BootstrapSpec,
    CanaryKind,
    DeploymentSpec,
    GenerationSpec,
    MechanismSection,
    MozoSpec,
    NeighbourSpec,
    Setting,
    TargetSpec,
    ThreatModel,
    VotingDesign,
    default_mechanism,
)
from dpicl_audit.probes.registry import ALL_PROBES, ProbeName

__all__ = ["AuditPlan"]


class AuditPlan(BaseModel):
    """One audit: target, data, canary, neighbour relation, mechanism, attack and statistics."""

    model_config = FROZEN

    name: str | None = Field(default=None, max_length=200)
    target: TargetSpec = Field(default_factory=TargetSpec)
    dataset: str = "news-mini"
    canary: CanaryKind = "natural"
    neighbour: NeighbourSpec = Field(default_factory=NeighbourSpec)
    mechanism: MechanismSection = Field(default_factory=default_mechanism)
    setting: Setting = "audit-template"
    deployment: DeploymentSpec = Field(default_factory=DeploymentSpec)
    threat_model: ThreatModel = "black-box"
    attack: Attack = "inquery"
    design: VotingDesign = "auto"
    trials: int = Field(default=1000, ge=10, le=10_000_000, description="Per epsilon.")
    queries: int = Field(
        default=1, ge=1, le=10_000, description="Paper 003 adversaries: queries in the sequence."
    )
    confidence: float = 0.95
    split: float = Field(
        default=DEFAULT_SELECTION_FRACTION,
        gt=0.0,
        lt=1.0,
        description="White-box: share of trials used to choose the threshold (0.5: 0.2 has "
        "more power on continuous scores, less on a bootstrap's tied ones; docs/auditing.md).",
    )
    seed: int = Field(default=0, ge=0, lt=2**63, description="Seeds the auditor's own choices.")
    concurrency: int = Field(default=8, ge=1, le=1024)
    timeout: float = Field(default=60.0, gt=0.0, le=3600.0, description="Seconds per request.")
    retries: int = Field(default=5, ge=0, le=20)
    batch_size: Annotated[int, Field(ge=1, le=100_000)] = 200
    bootstrap: BootstrapSpec = Field(default_factory=BootstrapSpec)
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    mozo: MozoSpec = Field(default_factory=MozoSpec)
    probes: tuple[ProbeName, ...] = Field(
        default=ALL_PROBES,
        description="The audits from outside beside the trials (default all; each costs its "
        "own answers: docs/auditing.md, 'What a default audit costs').",
    )

    @model_validator(mode="before")
    @classmethod
    def _mechanism_defaults(cls, data: Any) -> Any:
        # A mechanism may change a plan default (generation audits: the bundled
        # dialogue-summarisation set); a value the plan gives is kept.
        if not isinstance(data, Mapping):
            return data
        mech = data.get("mechanism")
        name = mech.get("name") if isinstance(mech, Mapping) else getattr(mech, "name", None)
        model = settings_for(str(name if name is not None else mechanism_names()[0]))
        if model is not None:
            data = {**model.plan_defaults, **data}
        return data

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("dataset must name a bundled corpus, a file or hf:<name>")
        if v.startswith("hf:") and not v[3:].strip():
            raise ValueError(f"hf: datasets need a name after the prefix, got {v!r}")
        return v

    @field_validator("probes")
    @classmethod
    def _probes(cls, v: tuple[ProbeName, ...]) -> tuple[ProbeName, ...]:
        twice = sorted({p for p in v if v.count(p) > 1})
        if twice:
            raise ValueError(f"probes names {twice} more than once")
        return tuple(p for p in ALL_PROBES if p in v)  # one order, whatever was typed

    @field_validator("confidence")
    @classmethod
    def _confidence(cls, v: float) -> float:
        if not 0.5 <= v < 1.0:
            raise ValueError(f"confidence must lie in [0.5, 1), got {v!r}")
        return v

    @model_validator(mode="after")
    def _cross(self) -> Self:
        pos = self.neighbour.position
        if pos is not None and pos >= self.mechanism.n_exemplars:
            raise ValueError(
                f"neighbour.position {pos} is outside the context of "
                f"{self.mechanism.n_exemplars} exemplars (partitions x shots)"
            )
        check_attack(self.attack, self.mechanism.name, self.threat_model)
        self.mechanism.check_plan(self)
        return self

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> AuditPlan:
        """Validate a nested mapping; raise :class:`InvalidPlan` naming every bad field."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise InvalidPlan(_describe(exc)) from exc

    @classmethod
    def from_toml(cls, path: str | Path) -> AuditPlan:
        """Read a plan from a TOML file (the layout: :mod:`dpicl_audit.plan.sources`)."""
        return cls.from_sources(path, {})

    @classmethod
    def from_sources(
        cls, path: str | Path | None, overrides: Mapping[str, object] | None = None
    ) -> AuditPlan:
        """A TOML file (optional) with dotted-key ``overrides`` (CLI flags) applied on top.

        ``overrides`` maps dotted paths (``"mechanism.epsilons"``, ``"target.base_url"``) to
        values; ``None`` values are ignored so unset flags keep the file's values.
        """
        return cls.from_mapping(plan_data_from_sources(path, overrides))

    # ----------------------------------------------------------------- views

    def public_dump(self) -> JsonObject:
        """The plan as JSON-ready data with the tokens masked (what the trial log stores)."""
        data = self.model_dump(mode="json")
        target = data["target"]
        for key in ("admin_token", "api_key"):
            if target.get(key) is not None:
                target[key] = MASK
        return data

    @classmethod
    def from_public(
        cls,
        data: Mapping[str, object],
        *,
        admin_token: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
    ) -> AuditPlan:
        """Rebuild a plan stored by :meth:`public_dump`, with fresh credentials."""
        return cls.from_mapping(
            public_plan_data(data, admin_token=admin_token, api_key=api_key, base_url=base_url)
        )

    def with_credentials(
        self, *, admin_token: str | None = None, api_key: str | None = None
    ) -> AuditPlan:
        """A copy with credentials filled in where given."""
        update: dict[str, object] = {}
        if admin_token is not None:
            update["admin_token"] = SecretStr(admin_token)
        if api_key is not None:
            update["api_key"] = SecretStr(api_key)
        if not update:
            return self
        return self.model_copy(update={"target": self.target.model_copy(update=update)})

    def setting_key(self, epsilon: float) -> str:
        """The trial log's name for the trials of one epsilon (``"eps=1"``)."""
        return f"eps={epsilon:g}"


def _shows_input(err: Any, loc: str, msg: str) -> bool:
    """Whether a plan error should quote the value it got: not for a missing value, not
    where the message already does, and never for a token."""
    if err["type"] == "missing" or "input" not in err or "got " in msg:
        return False
    return "token" not in loc and "key" not in loc


def _describe(exc: ValidationError) -> str:
    msgs = []
    for err in exc.errors():
        parts = [str(p) for p in err["loc"]]
        if parts[:1] == ["mechanism"] and len(parts) > 2 and parts[1] in mechanism_names():
            del parts[1]  # the union's tag: the section's field is mechanism.<field>
        loc = ".".join(parts) or "plan"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        elif _shows_input(err, loc, msg):
            shown = repr(err["input"])
            msg += f" (got {shown[:77] + '...' if len(shown) > 80 else shown})"
        msgs.append(f"{loc}: {msg}")
    return "invalid audit plan: " + "; ".join(msgs)
