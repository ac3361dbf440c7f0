"""What a context is: its task, labels, exemplars, template, mechanism and budget.

These models are validated on construction and double as the request schemas of
``POST /v1/contexts``, so the OpenAPI document and the server agree by construction.
Every error names the offending value (pydantic reports its location as ``param``).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from dpicl.errors import ConfigurationError

Task = Literal["classification", "generation"]

DEFAULT_TEMPLATES: dict[str, str] = {
    "classification": (
        "Classify the input. Answer with exactly one of these labels: {labels}.\n\n"
        "{exemplars}\n\nInput: {query}\nLabel:"
    ),
    "generation": "Follow the examples.\n\n{exemplars}\n\nInput: {query}\nOutput:",
}


# Hard bounds of the privacy parameters. Every accounting computation (the PLD grid, the
# brentq conversions, the DPS-MOZO calibration) has bounded cost inside them, measured at
# the corners at 0.2 s or less; a deployment never needs values outside (an epsilon of 100
# per answer is no privacy at all). Below delta = 1e-12 dp-accounting's PLD, whose tail
# truncation is about 1e-15, no longer gives a finite epsilon_exact. The settings
# (DPICL_MAX_EPSILON, ...) may only tighten these.
EPSILON_MIN = 1e-3
EPSILON_MAX = 100.0
BUDGET_EPSILON_MAX = 1000.0
DELTA_MIN = 1e-12
DELTA_MAX = 0.5
MAX_TEXT_CHARS = 20_000
MAX_LABEL_CHARS = 200
MAX_LABELS = 1000
MAX_PARTITIONS = 10_000
MAX_EXEMPLARS = 10_000

MAX_SYNTHESIZE_INPUTS = 10_000
MAX_NAME_CHARS = 200  # the store's name column
#: A tenant's name: what an operator types, short enough for the store's tenant column.
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
Tenant = Annotated[
    str,
    Field(
        pattern=TENANT_PATTERN,
        description="1-64 characters: letters, digits and _ . : - (not first).",
    ),
]
#: Contexts per page of GET /v1/contexts: each costs its ledger's accounting (a DPS-MOZO
#: context's composed epsilon takes up to about 10 ms), so a page stays well under a second.
MAX_LIST_LIMIT = 200

# PostgreSQL refuses NUL in text; checked by the schema (pydantic-core, no Python per
# string), which also refuses lone UTF-16 surrogates (JSON's "\ud800") that no driver can
# encode as UTF-8.
NO_NUL = r"^[^\x00]*$"
#: Characters nobody sees: Unicode's Default_Ignorable_Code_Point set (zero-width spaces and
#: joiners, the word joiner, the BOM, soft hyphens, bidi controls, variation selectors,
#: Hangul fillers, tags). Spelled out rather than as \p{...}: the pattern must mean the same
#: to pydantic-core's Rust regex (which checks it) and to Python's re (the OpenAPI
#: document's fuzzers read it); a test holds it equal to Rust's property.
INVISIBLE = (
    r"\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
    r"\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
#: One character a reader can see: not whitespace, not a control character (NUL is one),
#: not invisible. "\u200b\u2060\ufeff" is as blank as "   ".
VISIBLE = rf"[^\s\x00-\x1f\x7f-\x9f{INVISIBLE}]"
#: Not blank either (queries, public inputs, exemplars, labels): at least one visible
#: character.
NONBLANK_NO_NUL = rf"^[^\x00]*{VISIBLE}[^\x00]*$"

#: Every free text the server accepts.
Text = Annotated[str, Field(pattern=NO_NUL)]
#: Texts that mean nothing when blank: exemplars and labels (a label of spaces is not one a
#: reader can tell from another, and an exemplar of spaces demonstrates nothing), queries
#: and public inputs. Blank means no visible character (:data:`VISIBLE`).
NonBlankText = Annotated[str, Field(pattern=NONBLANK_NO_NUL)]

#: The invisible characters themselves (Python's re reads the class as Rust's does).
_INVISIBLE_RE = re.compile(f"[{INVISIBLE}]")

_HAS_VISIBLE: TypeAdapter[str] = TypeAdapter(Annotated[str, Field(pattern=VISIBLE)])


def is_blank(text: str) -> bool:
    """Whether ``text`` has no visible character: what :data:`NonBlankText` refuses, by the
    same regex (pydantic searches a pattern), for checks outside a request schema."""
    try:
        _HAS_VISIBLE.validate_python(text)
    except ValidationError:
        return True
    return False


def _json_number(value: object) -> object:
    # Lax pydantic reads true as 1 and "4" as 4: "epsilon": true made a context of
    # epsilon 1. A JSON number is the only number (4.0 still counts as the integer 4).
    if isinstance(value, bool | str):
        raise PydanticCustomError("number_type", "Input should be a number")
    return value


# Numbers of the request schemas: JSON numbers only, never a boolean or a string. (The
# validator sits beside the bounds, not in a nested alias, where pydantic would write the
# bounds into the JSON schema as "ge" and "le" instead of "minimum" and "maximum".)
JsonNumber = BeforeValidator(_json_number)
Int = Annotated[int, JsonNumber]
OptionalInt = Annotated[int | None, JsonNumber]
Float = Annotated[float, JsonNumber]

Epsilon = Annotated[float, Field(ge=EPSILON_MIN, le=EPSILON_MAX, allow_inf_nan=False), JsonNumber]
BudgetEpsilon = Annotated[
    float, Field(ge=EPSILON_MIN, le=BUDGET_EPSILON_MAX, allow_inf_nan=False), JsonNumber
]
Delta = Annotated[float, Field(ge=DELTA_MIN, le=DELTA_MAX, allow_inf_nan=False), JsonNumber]


class Exemplar(BaseModel):
    """One private demonstration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Annotated[NonBlankText, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
    output: Annotated[NonBlankText, Field(min_length=1, max_length=MAX_TEXT_CHARS)]


class _PartitionedGaussian(BaseModel):
    """Settings shared by the partition-and-aggregate Gaussian mechanisms (voting, ESA)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: Epsilon = Field(description="Per-query epsilon.")
    delta: Delta = Field(default=1e-5, description="Per-query delta.")
    partitions: Int = Field(
        default=10, ge=1, le=MAX_PARTITIONS, description="Number of disjoint partitions T <= |D|."
    )
    partition_seed: OptionalInt = Field(
        default=None, ge=0, lt=2**63, description="Seed of the partition permutation."
    )
    partitioning: Literal["positional", "hash"] = "positional"
    calibration: Literal["classic", "analytic"] = "classic"


class VotingSettings(_PartitionedGaussian):
    """Private voting (Algorithm 2 of Wu et al., as audited in paper 000)."""

    name: Literal["voting"] = "voting"
    temperature: Float = Field(default=0.0, ge=0.0, le=10.0)


class EsaSettings(_PartitionedGaussian):
    """Embedding space aggregation (Algorithm 3 of paper 000, Algorithm 4 of paper 004)."""

    name: Literal["esa"] = "esa"
    sensitivity: Literal["tight", "original"] = Field(
        default="tight",
        description="L2 sensitivity of the mean: 2/T (paper 000, Appendix A) or 1 (original).",
    )
    temperature: Float = Field(default=1.0, ge=0.0, le=10.0)
    candidates: Int = Field(default=8, ge=1, le=64, description="Zero-shot candidates T_cand.")
    max_tokens: Int = Field(default=48, ge=1, le=1024)


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
    epsilon: Epsilon = Field(description="Total epsilon over all `queries` answers.")
    delta: Delta | None = Field(
        default=None, description="Total delta; default 1/|D| (|D| exemplars)."
    )
    guarantee: Literal["proven", "paper"] = Field(
        default="proven",
        description="proven: max-log-ratio constraint, true (epsilon, delta); paper: paper "
        "004's Renyi constraint, nominal epsilon.",
    )
    alpha: OptionalInt = Field(
        default=None,
        ge=2,
        le=1024,
        description="guarantee paper only: Renyi order; default: the smallest whose "
        "RDP-to-DP conversion costs at most epsilon/2 (paper 004, Section 5.1).",
    )
    n_shots: Int = Field(
        default=4, ge=1, le=1024, description="Exemplars sampled per token (<= |D|)."
    )
    top_k: Int = Field(default=100, ge=1, le=1000, description="Zero-shot top-k support.")
    max_tokens: Int = Field(default=48, ge=1, le=1024, description="T_max per answer.")
    queries: Int = Field(ge=1, le=1_000_000, description="Answers the context will give.")
    lambda_max: Float = Field(default=1.5, ge=0.0, le=10.0, description="Upper end of lambda.")

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
    max_tokens: Int = Field(default=48, ge=1, le=1024)
    temperature: Float = Field(default=0.0, ge=0.0, le=10.0)
    derived_from: str | None = None


MechanismSettings = Annotated[
    VotingSettings | EsaSettings | MozoSettings, Field(discriminator="name")
]


class ContextLimits(Protocol):
    """The server's limits on a context (:class:`dpicl.config.Settings` satisfies it)."""

    max_exemplars: int
    max_labels: int
    max_partitions: int
    max_epsilon: float
    max_budget_epsilon: float
    allow_unbudgeted: bool


class BudgetSpec(BaseModel):
    """Total (epsilon, delta) a context may spend over all its answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: BudgetEpsilon
    delta: Delta


class ContextSpec(BaseModel):
    """The body of ``POST /v1/contexts``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[Text, Field(max_length=MAX_NAME_CHARS)] | None = None
    task: Task = "classification"
    labels: list[Annotated[NonBlankText, Field(min_length=1, max_length=MAX_LABEL_CHARS)]] = Field(
        default_factory=list, max_length=MAX_LABELS
    )
    exemplars: list[Exemplar] = Field(min_length=1, max_length=MAX_EXEMPLARS)
    template: Annotated[Text, Field(max_length=MAX_TEXT_CHARS)] | None = None
    mechanism: MechanismSettings
    budget: BudgetSpec | None = Field(
        default=None,
        description="Required for voting and ESA: give {epsilon, delta}, or an explicit null "
        "where the server allows unbudgeted contexts (DPICL_ALLOW_UNBUDGETED). DPS-MOZO "
        "contexts are budgeted by the mechanism itself: omit it.",
    )
    tenant: Tenant | None = Field(
        default=None,
        description="The tenant whose keys reach this context (keys scoped to the tenant).",
    )

    def check(self, limits: ContextLimits | None = None) -> None:
        """Cross-field checks and the server's limits; raise :class:`ConfigurationError`
        naming the bad value."""
        if limits is not None:
            self._check_limits(limits)
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
            # Labels a reader cannot tell apart in an answer are not distinct either:
            # "é" composed and decomposed, "Yes" and "Yes ", "Yes" and "Ye\u200bs".
            seen: dict[str, int] = {}
            for i, label in enumerate(self.labels):
                key = _INVISIBLE_RE.sub("", unicodedata.normalize("NFC", label)).strip()
                if key in seen:
                    j = seen[key]
                    raise ConfigurationError(
                        f"labels {j} ({self.labels[j]!r}) and {i} ({label!r}) differ only in "
                        "Unicode normalisation, invisible characters or surrounding whitespace",
                        param=f"labels.{i}",
                    )
                seen[key] = i
            for i, e in enumerate(self.exemplars):
                if e.output not in self.labels:
                    raise ConfigurationError(
                        # The exemplar is private: named by its index, never quoted.
                        f"exemplars.{i}.output is not one of the labels {self.labels!r}",
                        param=f"exemplars.{i}.output",
                    )
        if self.template is not None:
            # Each slot is filled once per prompt: a template of 20,000 characters holding
            # "{exemplars}" 1,800 times made every prompt 1,800 copies of the exemplars.
            for slot, least in (("{exemplars}", 1), ("{query}", 1), ("{labels}", 0)):
                count = self.template.count(slot)
                if not least <= count <= 1:
                    wanted = "exactly once" if least else "at most once"
                    raise ConfigurationError(
                        f"the template must contain the slot {slot} {wanted} (it has {count})",
                        param="template",
                    )
        mech = self.mechanism
        if isinstance(mech, MozoSettings):
            self._check_mozo(mech)
            return
        # Both schemes: hash partitioning leaves some partitions empty beyond |D|, and T is
        # the size of every answer's engine batch.
        if mech.partitions > len(self.exemplars):
            raise ConfigurationError(
                f"partitions T={mech.partitions} is larger than the number of exemplars "
                f"({len(self.exemplars)})",
                param="mechanism.partitions",
            )
        if limits is None:  # a library caller is its own operator
            return
        if "budget" not in self.model_fields_set:
            raise ConfigurationError(
                "budget is required: give budget {epsilon, delta}, or an explicit "
                '"budget": null where the server allows unbudgeted contexts',
                param="budget",
            )
        if self.budget is None and not limits.allow_unbudgeted:
            raise ConfigurationError(
                '"budget": null (a context that answers forever) is refused by this server; '
                "give budget {epsilon, delta} or set DPICL_ALLOW_UNBUDGETED=true",
                param="budget",
            )

    def _check_limits(self, limits: ContextLimits) -> None:
        checks: list[tuple[str, float, float, str]] = [
            ("exemplars", len(self.exemplars), limits.max_exemplars, "DPICL_MAX_EXEMPLARS"),
            ("labels", len(self.labels), limits.max_labels, "DPICL_MAX_LABELS"),
            ("mechanism.epsilon", self.mechanism.epsilon, limits.max_epsilon, "DPICL_MAX_EPSILON"),
        ]
        if isinstance(self.mechanism, _PartitionedGaussian):
            checks.append(
                (
                    "mechanism.partitions",
                    self.mechanism.partitions,
                    limits.max_partitions,
                    "DPICL_MAX_PARTITIONS",
                )
            )
        if self.budget is not None:
            checks.append(
                (
                    "budget.epsilon",
                    self.budget.epsilon,
                    limits.max_budget_epsilon,
                    "DPICL_MAX_BUDGET_EPSILON",
                )
            )
        for param, value, limit, setting in checks:
            if value > limit:
                raise ConfigurationError(
                    f"{param}={value!r} exceeds this server's limit of {limit!r} ({setting})",
                    param=param,
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
                f"answers; omit budget (got {self.budget!r})",
                param="budget",
            )

    def resolved_template(self) -> str:
        return self.template if self.template is not None else DEFAULT_TEMPLATES[self.task]
