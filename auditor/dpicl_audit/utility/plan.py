"""The utility audit's plan: what to ask (dataset, grid of epsilons and partitions, queries)
and of whom (the target), and the deterministic draws it implies.

**Default sizes.** 100 held-out queries per cell: the widest 95% Clopper-Pearson interval of
100 queries is 0.20 wide (+-0.10, at accuracy 0.5; narrower away from it), so two cells whose
accuracies differ by more than about 0.2 have intervals that do not overlap; :data:`DEFAULT_WIDTH`
and :func:`~.estimators.queries_for_width` state it. The queries are spread round-robin over
``contexts`` exemplar draws, the same draws in every cell (so the cells differ only in epsilon
and T), each draw disjoint from the queries.

**Cells.** One per (epsilon, T) of the grid (``eps=4,T=8``), and the two baselines:
``few-shot`` (the same exemplars in one prompt, no noise: the clean vote of one partition
holding them all, read from a white-box server's ``/v1/debug``) and ``zero-shot`` (the
context's template with no exemplar, from dpicl's admin route ``/v1/zero-shot``, which needs
no white-box level; behind a hook with no dpicl server beside it, a context without
exemplars, where the deployment takes one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field, field_validator, model_validator

from dpicl_audit.catalog.mechanisms import model_name, settings_models
from dpicl_audit.catalog.settings import GaussianSettings
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.jsontypes import JsonObject
from dpicl_audit.plan.specs import FROZEN, TargetSpec
from dpicl_audit.utility.estimators import interval_width

__all__ = [
    "DEFAULT_QUERIES",
    "DEFAULT_WIDTH",
    "FEW_SHOT",
    "GENERATION_SETS",
    "MAJORITY",
    "ZERO_SHOT",
    "Cell",
    "Draws",
    "UtilityPlan",
    "cell_name",
    "draw_split",
]

DEFAULT_QUERIES = 100
DEFAULT_DATASET = "reviews-mini"
#: The widest 95% interval of the default query count (0.2 at 100 queries).
DEFAULT_WIDTH = round(interval_width(DEFAULT_QUERIES), 3)
FEW_SHOT = "few-shot"
ZERO_SHOT = "zero-shot"
#: The majority-class baseline: computed from the queries' labels, no query asked.
MAJORITY = "majority"
#: Bundled sets that are generation tasks (every other set is classification).
GENERATION_SETS = frozenset({"dialogsum-mini"})
#: The draws' random stream, apart from any other use of the seed.
_STREAM_SPLIT = 0x07_11_17


def cell_name(epsilon: float, partitions: int) -> str:
    return f"eps={epsilon:g},T={partitions}"


@dataclass(frozen=True, slots=True)
class Cell:
    """One setting of the audit: a private (epsilon, T) cell or a baseline."""

    name: str
    kind: Literal["private", "few-shot", "zero-shot"]
    epsilon: float
    partitions: int

    @property
    def prompts_per_query(self) -> int:
        """LLM prompts behind one answer (what the time estimate scales by)."""
        return self.partitions


class UtilityPlan(BaseModel):
    """Everything a utility audit needs (stored with its run, tokens masked)."""

    model_config = FROZEN

    target: TargetSpec = Field(default_factory=TargetSpec)
    baseline_url: str | None = Field(
        default=None,
        description="A dpicl server over the same model for the baselines (zero-shot: any "
        "white-box level; non-private: DPICL_WHITEBOX=internal); default: the target itself "
        "on dpicl's routes.",
    )
    #: The default where the bundled model is measured above the majority-class rate with
    #: exemplar calibration (docs/utility.md); bbc-news stays selectable and reads DEGENERATE
    #: (under privacy with exemplar calibration; outright with ``label_calibration='none'``).
    dataset: str = DEFAULT_DATASET
    task: Literal["classification", "generation"] | None = None
    epsilons: list[float] = Field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0], min_length=1)
    partitions: list[int] = Field(default_factory=lambda: [4], min_length=1)
    queries: int = Field(default=DEFAULT_QUERIES, ge=1, le=100_000)
    exemplars: int = Field(default=16, ge=1, le=1000, description="Exemplars per context.")
    contexts: int = Field(default=4, ge=1, le=1000, description="Exemplar draws per cell.")
    delta: float = Field(default=1e-5, gt=0.0, lt=1.0)
    max_tokens: int | None = Field(default=None, ge=1, le=1024)
    label_calibration: Literal["none", "content-free", "exemplars"] = Field(
        default="exemplars",
        description="Voting's label_calibration on every context (content-free: contextual "
        "calibration, Zhao et al. 2021; exemplars: batch calibration by each partition's own "
        "exemplars, Zhou et al. 2024). The few-shot baseline is calibrated the same way; the "
        "zero-shot baseline too under content-free, and uncalibrated under exemplars (it has "
        "none).",
    )
    baselines: bool = True
    seed: int = Field(default=2026, ge=0, lt=2**63)
    concurrency: int = Field(default=4, ge=1, le=256)
    timeout: float = Field(default=300.0, gt=0.0, le=3600.0)
    retries: int = Field(default=5, ge=0, le=20)

    @field_validator("epsilons")
    @classmethod
    def _eps(cls, v: list[float]) -> list[float]:
        for e in v:
            if not (math.isfinite(e) and e > 0):
                raise ValueError(f"every epsilon must be a finite number above 0, got {e!r}")
        return sorted(set(v))

    @field_validator("partitions")
    @classmethod
    def _parts(cls, v: list[int]) -> list[int]:
        for t in v:
            if t < 1:
                raise ValueError(f"every partition count must be at least 1, got {t!r}")
        return sorted(set(v))

    @model_validator(mode="after")
    def _cross(self) -> Self:
        if max(self.partitions) > self.exemplars:
            raise ValueError(
                f"partitions T={max(self.partitions)} is larger than the exemplars per context "
                f"({self.exemplars})"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _task(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("task") is None:
            ds = str(data.get("dataset", DEFAULT_DATASET)).strip()
            task = "generation" if ds in GENERATION_SETS else "classification"
            data = {**data, "task": task}
        return data

    @property
    def mechanism(self) -> str:
        """The mechanism the cells' contexts use: the first partitioned Gaussian mechanism of
        the plan's task in the catalogue (utility.contexts writes such a body)."""
        task = "classification" if self.task == "classification" else "generation"
        found = (m for m in settings_models() if issubclass(m, GaussianSettings) and m.task == task)
        return model_name(next(found))

    def cells(self) -> list[Cell]:
        """The private cells in grid order, then the baselines (when asked for)."""
        out = [
            Cell(cell_name(e, t), "private", e, t) for t in self.partitions for e in self.epsilons
        ]
        if self.baselines:
            # The baselines' epsilon only sizes their budget: few-shot's answer is the clean
            # vote, and zero-shot's context holds nothing private.
            out += [Cell(FEW_SHOT, "few-shot", 1.0, 1), Cell(ZERO_SHOT, "zero-shot", 1.0, 1)]
        return out

    def stored(self) -> JsonObject:
        return self.model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class Draws:
    """Indices into the dataset: the held-out queries and each context's exemplars."""

    queries: npt.NDArray[np.int64]
    contexts: tuple[npt.NDArray[np.int64], ...]

    def context_of(self, query_index: int) -> int:
        """Round-robin: query ``i`` goes to draw ``i mod contexts``."""
        return query_index % len(self.contexts)


def draw_split(n_examples: int, plan: UtilityPlan) -> Draws:
    """The held-out queries and the context draws, from the plan's seed. The queries come first
    from one permutation; the draws take the rest, disjoint from each other while the data
    lasts, then drawn afresh (without replacement within a draw) from the training part."""
    need = plan.queries + plan.exemplars
    if n_examples < need:
        raise InvalidPlan(
            f"dataset {plan.dataset!r} has {n_examples} examples; {plan.queries} queries and "
            f"{plan.exemplars} exemplars per context need at least {need}"
        )
    rng = np.random.default_rng([plan.seed, _STREAM_SPLIT])
    order = rng.permutation(n_examples)
    queries = order[: plan.queries]
    train = order[plan.queries :]
    draws: list[npt.NDArray[np.int64]] = []
    for j in range(plan.contexts):
        start = j * plan.exemplars
        if start + plan.exemplars <= train.size:
            draws.append(train[start : start + plan.exemplars])
        else:
            draws.append(rng.choice(train, size=plan.exemplars, replace=False))
    return Draws(queries.astype(np.int64), tuple(d.astype(np.int64) for d in draws))
