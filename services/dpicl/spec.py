"""The body of ``POST /v1/contexts``: a context's task, labels, exemplars, template,
mechanism and budget, validated on construction (and the request schema of the route, so the
OpenAPI document and the server agree by construction).

``mechanism`` is the union, discriminated on ``name``, of the settings of every registered
mechanism (:func:`dpicl.mechanisms.registry.settings_models`: the built-ins and those
installed through entry points); an unknown name is a 422 naming it. Every error names the
offending value (pydantic reports its location as ``param``).
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field

from dpicl.domain import (
    DEFAULT_TEMPLATES,
    INVISIBLE_RE,
    MAX_EXEMPLARS,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    BudgetSpec,
    ContextLimits,
    Exemplar,
    NonBlankText,
    Task,
    Tenant,
    Text,
)
from dpicl.errors import ConfigurationError
from dpicl.mechanisms.base import NewContext
from dpicl.mechanisms.registry import get_mechanism, settings_models

#: The settings of every mechanism ``POST /v1/contexts`` accepts, told apart by ``name``.
MechanismSettings: Any = Annotated[
    Union[settings_models()],  # noqa: UP007 (a union built from a tuple of models)
    Field(discriminator="name"),
]


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
        mechanism = get_mechanism(self.mechanism.name)
        wanted = mechanism.task
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
                key = INVISIBLE_RE.sub("", unicodedata.normalize("NFC", label)).strip()
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
                    times = "exactly once" if least else "at most once"
                    raise ConfigurationError(
                        f"the template must contain the slot {slot} {times} (it has {count})",
                        param="template",
                    )
        new = NewContext(
            n_exemplars=len(self.exemplars),
            budget=self.budget,
            budget_given="budget" in self.model_fields_set,
            limits=limits,
        )
        mechanism.check(self.mechanism, new)

    def _check_limits(self, limits: ContextLimits) -> None:
        checks: list[tuple[str, float, float, str]] = [
            ("exemplars", len(self.exemplars), limits.max_exemplars, "DPICL_MAX_EXEMPLARS"),
            ("labels", len(self.labels), limits.max_labels, "DPICL_MAX_LABELS"),
            ("mechanism.epsilon", self.mechanism.epsilon, limits.max_epsilon, "DPICL_MAX_EPSILON"),
        ]
        partitions = getattr(self.mechanism, "partitions", None)
        if partitions is not None:  # any mechanism over T partitions
            checks.append(
                ("mechanism.partitions", partitions, limits.max_partitions, "DPICL_MAX_PARTITIONS")
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

    def resolved_template(self) -> str:
        return self.template if self.template is not None else DEFAULT_TEMPLATES[self.task]
