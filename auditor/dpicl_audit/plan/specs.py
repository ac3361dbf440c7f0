"""The sections of an audit plan (target, mechanism, neighbours, deployment, bootstrap,
generation, DPS-MOZO) and the names their fields take; :mod:`.model` puts them together.

The mechanism section is each mechanism's own settings model (in its folder of
:mod:`dpicl_audit.mechanisms`), told apart by ``name``: :data:`MechanismSection` is their
union, assembled from the catalogue of mechanisms as the server's context body is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeAlias, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from dpicl_audit.catalog.mechanisms import check_mechanism_name, mechanism_names, settings_models
from dpicl_audit.catalog.settings import Calibration, MechanismSettings
from dpicl_audit.prompts import SIGNAL_PAIRS

__all__ = [
    "FROZEN",
    "BootstrapSpec",
    "Calibration",
    "CanaryKind",
    "DeploymentSpec",
    "EmbeddingSource",
    "GenerationSpec",
    "MechanismSection",
    "MechanismSettings",
    "MozoSpec",
    "NeighbourSpec",
    "Setting",
    "TargetApi",
    "TargetSpec",
    "ThreatModel",
    "VotingDesign",
    "default_mechanism",
]

CanaryKind = Literal["natural", "mislabeled", "random"]
Setting = Literal["audit-template", "deployment"]
ThreatModel = Literal["black-box", "white-box"]
EmbeddingSource = Literal["auto", "server", "local"]
#: Voting's neighbour designs (docs/auditing.md, "Designs"): ``paper`` = paper 000's
#: [1, T-1] against [0, T]; ``pivotal`` = the other partitions pinned so the canary's
#: partition decides (Prompt 1); ``identical`` = pivotal with one text in every partition,
#: made-up word labels and a minimal template (the strongest on a real model); ``auto`` =
#: pivotal on a simulator, identical on a real engine (inquery in the audit template only).
#: ESA has the same four (mechanisms.esa.build: the canary's partition decides which signal
#: text is nearer the noisy mean).
VotingDesign = Literal["auto", "paper", "pivotal", "identical"]
#: Which surface the audit queries go through: dpicl's own routes, or the OpenAI-compatible
#: chat completions (any OpenAI-compatible DP-ICL endpoint, with a context hook).
TargetApi = Literal["native", "openai"]


def _named(data: Any) -> Any:
    """The section with its ``name`` checked (an unknown one named, with the known ones),
    the default mechanism's where it has none."""
    if isinstance(data, Mapping):
        data = {"name": mechanism_names()[0], **data}
        check_mechanism_name(data["name"])
    return data


#: The plan's ``[mechanism]``: the settings of any mechanism with an audit, built in or
#: registered (catalog.mechanisms), told apart by ``name``. The type checker sees their
#: base; an audit reads its own fields through its settings model (``settings_of``).
if TYPE_CHECKING:
    MechanismSection: TypeAlias = MechanismSettings
else:
    MechanismSection = Annotated[
        Union[settings_models()],  # noqa: UP007 (a union built from a tuple of models)
        Field(discriminator="name"),
        BeforeValidator(_named),
    ]


def default_mechanism() -> MechanismSettings:
    """The section of a plan that names no mechanism: the first built-in's defaults."""
    return settings_models()[0](name=mechanism_names()[0])


FROZEN = ConfigDict(frozen=True, extra="forbid")


class TargetSpec(BaseModel):
    """The server under audit and the credentials the audit uses."""

    model_config = FROZEN

    base_url: str = "http://127.0.0.1:8000"
    admin_token: SecretStr | None = Field(
        default=None, description="Admin token: creates contexts, calls /v1/debug/*."
    )
    api_key: SecretStr | None = Field(
        default=None, description="User key for /v1/classify; the admin token when absent."
    )
    api: TargetApi = Field(
        default="native",
        description="native: /v1/classify and /v1/generate; openai: /v1/chat/completions "
        "(black-box only), the answer read from `choices`.",
    )
    context_hook: str | None = Field(
        default=None,
        max_length=2000,
        description="Creates each neighbouring context instead of POST /v1/contexts: a Python "
        "entry point `module:function` or a command; it receives the context (JSON) and "
        "returns the model id to query (openai only).",
    )
    max_budget_epsilon: float | None = Field(
        default=None,
        gt=0.0,
        le=1000.0,
        description="The largest context budget epsilon the server takes "
        "(DPICL_MAX_BUDGET_EPSILON): contexts are budgeted within it. Unset: read from the "
        "server's /healthz (limits.max_budget_epsilon) when a run starts, 1000 where it "
        "publishes none; the lower of the two where both are known. Stored resolved with the "
        "run, so a resumed run plans the same contexts.",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {v!r}")
        # Caught here, not as an httpx or socket traceback at the first request.
        import httpx

        try:
            url = httpx.URL(v)
        except httpx.InvalidURL as exc:
            raise ValueError(f"base_url {v!r} is not a URL: {exc}") from None
        if not url.host:
            raise ValueError(f"base_url {v!r} names no host")
        if url.port is not None and not 1 <= url.port <= 65_535:
            raise ValueError(f"base_url {v!r} has port {url.port}, outside 1 to 65535")
        return v

    @model_validator(mode="after")
    def _hook_needs_openai(self) -> Self:
        if self.context_hook is not None and self.api != "openai":
            raise ValueError(
                "context_hook (--context-hook) creates the contexts of an OpenAI-compatible "
                "endpoint: it needs api = 'openai' (--api openai)"
            )
        if self.context_hook is not None and not self.context_hook.strip():
            raise ValueError("context_hook is blank")
        return self


class NeighbourSpec(BaseModel):
    """The neighbour relation: replace-one at a fixed position with a shared partition seed.

    C1 holds the canary at ``position``; C0 holds a replacement exemplar there; every other
    exemplar, the order, the size and ``partition_seed`` are the same, so the two contexts
    differ in exactly one partition (DESIGN.md section 4). No other relation is offered: under
    add/remove adjacency the server's positional partitioning is not a valid neighbour pair.
    """

    model_config = FROZEN

    relation: Literal["replace-one"] = "replace-one"
    position: int | None = Field(default=None, ge=0, description="Drawn from the seed if None.")
    partition_seed: int | None = Field(
        default=None, ge=0, lt=2**63, description="Drawn from the seed if None."
    )


class DeploymentSpec(BaseModel):
    """A deployment's label set and template (setting = "deployment")."""

    model_config = FROZEN

    labels: tuple[str, ...] | None = Field(
        default=None, description="The deployment's labels; default: the dataset's labels."
    )
    template: str | None = Field(
        default=None, description="The deployed template; default: the server's default."
    )
    positive: str | None = Field(default=None, description="Answer meaning 'canary present'.")
    negative: str | None = Field(default=None, description="Answer meaning 'canary absent'.")
    context: str | None = Field(
        default=None,
        description="A deployed context id (or OpenAI model id) whose own settings the audit "
        "covers: its epsilon joins the plan's epsilons, its partitions and delta are the plan's "
        "(each unless the plan sets it).",
    )

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        if len(v) < 2:
            raise ValueError(f"a deployment needs at least 2 labels, got {list(v)!r}")
        if len(set(v)) != len(v):
            raise ValueError(f"deployment labels must be distinct, got {list(v)!r}")
        if any(not lab.strip() for lab in v):
            raise ValueError("deployment labels must not be empty")
        return v

    @field_validator("template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            for slot in ("{exemplars}", "{query}"):
                if slot not in v:
                    raise ValueError(f"the deployment template must contain the slot {slot}")
        return v

    @model_validator(mode="after")
    def _options(self) -> Self:
        if self.positive is not None and self.positive == self.negative:
            raise ValueError(f"positive and negative must differ, both are {self.positive!r}")
        if self.labels is not None:
            for name, lab in (("positive", self.positive), ("negative", self.negative)):
                if lab is not None and lab not in self.labels:
                    raise ValueError(f"{name} label {lab!r} is not one of {list(self.labels)!r}")
        return self


class BootstrapSpec(BaseModel):
    """Algorithm 1 of paper 000: n_llm clean vote vectors per world, n_sample simulated trials."""

    model_config = FROZEN

    n_llm: int = Field(default=200, ge=2, le=1_000_000)
    n_sample: int = Field(default=400_000, ge=10, le=100_000_000)


class GenerationSpec(BaseModel):
    """ESA audits: the signal pair (y1 means "canary present") and where e(y) comes from."""

    model_config = FROZEN

    signal: str = Field(default="clock-foxborough", description="A Table 3 pair by name.")
    y1: str | None = Field(default=None, description="Own pair: the 'present' answer.")
    y0: str | None = Field(default=None, description="Own pair: the 'absent' answer.")
    embeddings: EmbeddingSource = "auto"
    embedder: str | None = Field(
        default=None, description="Local sentence-transformers model; None: bundled MiniLM."
    )

    @model_validator(mode="after")
    def _pair(self) -> Self:
        if (self.y1 is None) != (self.y0 is None):
            raise ValueError("give both generation.y1 and generation.y0, or neither")
        if self.y1 is not None and self.y0 is not None:
            if not self.y1.strip() or not self.y0.strip():
                raise ValueError("generation.y1 and generation.y0 must not be empty")
            if self.y1.strip() == self.y0.strip():
                raise ValueError(f"generation.y1 and y0 must differ, both are {self.y1!r}")
        elif self.signal not in SIGNAL_PAIRS:
            raise ValueError(
                f"unknown signal pair {self.signal!r}; built in: {sorted(SIGNAL_PAIRS)}"
            )
        return self


class MozoSpec(BaseModel):
    """DPS-MOZO audits: the two first tokens meaning "canary present" / "absent"."""

    model_config = FROZEN

    signals: tuple[str, str] = ("red", "blue")

    @field_validator("signals")
    @classmethod
    def _signals(cls, v: tuple[str, str]) -> tuple[str, str]:
        s1, s0 = (x.strip() for x in v)
        if not s1 or not s0 or s1 == s0:
            raise ValueError(f"need two distinct non-empty signals, got {list(v)!r}")
        if s0.startswith(s1):
            raise ValueError(f"signal 0 {s0!r} must not start with signal 1 {s1!r}")
        return (s1, s0)
