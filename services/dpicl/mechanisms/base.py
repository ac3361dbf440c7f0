"""What a mechanism is to the server: the :class:`Mechanism` base class and the types its
methods pass (documented as a whole in :mod:`dpicl.mechanisms.registry`).

This module sits below every mechanism folder and below the registry: a mechanism
subclasses :class:`Mechanism` without importing the registry that lists it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, JsonValue, ValidationError

from dpicl.domain import BudgetSpec, ContextLimits, Task
from dpicl.engines.base import Embedder, Engine
from dpicl.errors import ConfigurationError
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.store.repository import StoredContext

if TYPE_CHECKING:
    from fastapi import APIRouter

#: The stored mechanism record, a JSON object: the user's settings plus what calibration
#: derived (what ``GET /v1/contexts/{id}`` shows as ``mechanism``).
Record = dict[str, JsonValue]

#: A mechanism's calibration: its stored record, typed (a pydantic model).
C = TypeVar("C", bound=BaseModel)


class Runtime(Protocol):
    """What a pipeline may use of the running server (``dpicl.web.deps.Services``)."""

    @property
    def engine(self) -> Engine: ...

    async def get_embedder(self) -> Embedder: ...


class TokenSink(Protocol):
    """Hears an answer as it is released (streaming): its cost and the budget after the
    charge, before the first token, then each piece of text as its token is sampled.
    Mechanisms that release their answer whole never call it."""

    async def charged(self, cost: Cost, budget: BudgetStatus) -> None: ...

    async def text(self, delta: str) -> None: ...


class Outcome(Protocol):
    """One released answer, as the routes read it."""

    @property
    def context(self) -> StoredContext: ...  # with its ledger after the charge

    @property
    def text(self) -> str: ...  # the released text; a classification's label

    @property
    def cost(self) -> Cost: ...

    @property
    def budget(self) -> BudgetStatus: ...

    @property
    def finish_reason(self) -> Literal["stop", "length"]: ...

    @property
    def completion_tokens(self) -> int: ...  # tokens released one by one (0: whole)


@dataclass(frozen=True, slots=True)
class Answering:
    """The per-request arguments of :meth:`Mechanism.answer`."""

    runtime: Runtime
    ledger: Ledger  # billed to the caller's key
    rng: np.random.Generator  # DP randomness, seeded from OS entropy per request
    max_tokens: int | None = None  # the request's max_tokens (generation)
    exact: bool = False  # compute exact white-box diagnostics (DPICL_WHITEBOX=internal)
    sink: TokenSink | None = None  # stream the answer to it, where the mechanism can


@dataclass(frozen=True, slots=True)
class Sampling:
    """How a context's answers sample from the model: what the zero-shot baseline
    (``POST /v1/zero-shot``) answers with, so that it differs from a private answer only by
    the exemplars and the noise."""

    temperature: float = 0.0  # 0: argmax
    max_tokens: int | None = None  # a generation's tokens; None: the server's default
    #: "content-free": label scores divided by a content-free input's (contextual
    #: calibration, Zhao et al. 2021), as the context's partitions score; "none": raw;
    #: "exemplars": the partitions' own exemplars (batch calibration), which the zero-shot
    #: baseline has none of, so it answers uncalibrated.
    label_calibration: str = "none"


@dataclass(frozen=True, slots=True)
class NewContext:
    """What a mechanism's :meth:`Mechanism.check` sees of a new context besides its settings."""

    n_exemplars: int
    budget: BudgetSpec | None
    #: The request named ``budget`` (possibly as null).
    budget_given: bool
    #: The server's limits; None for a library caller, who is its own operator.
    limits: ContextLimits | None


@dataclass(frozen=True, slots=True)
class OwnBudget:
    """A mechanism that budgets itself (DPS-MOZO): the context's (epsilon, delta) and the
    answers it may give, instead of a ``budget`` from the request."""

    epsilon: float
    delta: float
    max_queries: int


class Mechanism(ABC, Generic[C]):
    """One DP mechanism the server serves, with its calibration model ``C``. Subclass it,
    set the class attributes and implement the abstract methods; the registry documents the
    contract."""

    #: The mechanism's name: the ``name`` of its settings and of its stored record.
    name: ClassVar[str]
    #: ``classification`` (served by /v1/classify) or ``generation`` (/v1/generate).
    task: ClassVar[Task]
    #: The settings model of ``POST /v1/contexts`` (its schema fragment; a pydantic model
    #: whose ``name`` field is ``Literal[<name>]``), or None for a mechanism that is never
    #: created from a request (``public`` contexts are derived by a synthesis).
    settings: ClassVar[type[BaseModel] | None]
    #: The stored record, typed: what :meth:`calibrate` derives and every answer reads,
    #: parsed once per loaded context (:meth:`calibration_of`).
    calibration: type[C]
    #: The white-box fields :meth:`debug_view` returns (None: no private internals). The
    #: ``/v1/debug/*`` response of a task is its answer's fields plus those of every
    #: mechanism of that task, flat (``dpicl.api.routes.debug``).
    debug_model: ClassVar[type[BaseModel] | None] = None

    def check(self, settings: Any, new: NewContext) -> None:
        """Cross-field checks of a new context beyond the settings' own schema (raise
        :class:`dpicl.errors.ConfigurationError` naming the bad value)."""
        return None

    @abstractmethod
    def calibrate(self, settings: Any, n_exemplars: int) -> C:
        """The calibration: the settings plus what calibration derived, once, at creation
        (every answer and report quotes the same numbers); stored as :meth:`record`."""

    def record(self, calibration: C) -> Record:
        """The stored record of ``calibration``: its fields, in order."""
        return calibration.model_dump()

    def calibration_of(self, context: StoredContext) -> C:
        """``context``'s stored record as this mechanism's calibration, parsed once per
        loaded context (kept with it: :meth:`StoredContext.record_as`)."""
        return context.record_as(self.calibration)

    def sampling(self, calibration: C) -> Sampling:
        """How ``calibration``'s answers sample (:class:`Sampling`); default: its
        ``temperature`` and ``max_tokens`` where it has them as numbers, else argmax and the
        server's default length."""
        temperature = getattr(calibration, "temperature", None)
        tokens = getattr(calibration, "max_tokens", None)
        label_calibration = getattr(calibration, "label_calibration", None)
        return Sampling(
            temperature=float(temperature) if isinstance(temperature, int | float) else 0.0,
            max_tokens=int(tokens) if isinstance(tokens, int | float) else None,
            label_calibration=label_calibration if isinstance(label_calibration, str) else "none",
        )

    def own_budget(self, calibration: C) -> OwnBudget | None:
        """The context's budget when the mechanism sets it itself; None: the request's."""
        return None

    @abstractmethod
    def cost(self, calibration: C) -> Cost:
        """The cost event of one answer, which the ledger composes (:class:`Cost`)."""

    def cost_of(self, context: StoredContext) -> Cost:
        """The cost event of one answer of ``context``."""
        return self.cost(self.calibration_of(context))

    @abstractmethod
    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        """One answer: charge the ledger first (``dpicl.pipelines.engine_calls``), run the
        engine, release, and report the outcome with the budget after the charge."""

    def debug_view(self, outcome: Any, whitebox: str) -> BaseModel | None:
        """The white-box fields of ``outcome`` for ``/v1/debug/*`` at ``whitebox``
        (``noisy`` or ``internal``), a :attr:`debug_model`; None: no private internals."""
        return None

    def routers(self) -> Sequence[APIRouter]:
        """Routes the mechanism adds to the API beyond answering (DPS-MOZO: its offline
        synthesis), which the app includes beside the contexts routes; default: none."""
        return ()

    def calibration_report(self, options: Mapping[str, Any]) -> Record:
        """What ``dpicl calibrate`` prints for ``options`` (the settings the command was
        given, by field name, as JSON reads them: from ``--settings``, ``--set KEY=VALUE``
        or ``--KEY VALUE``; the command knows none of them): the record a context with these
        settings would store (:meth:`calibrate`), without the partition seed, which is drawn
        per context. An option the settings do not have, or a value they refuse, is a
        :class:`ConfigurationError` naming it."""
        settings = settings_from_options(self, options)
        n = int(getattr(settings, "partitions", 1))  # the fewest exemplars it can serve
        record = self.record(self.calibrate(settings, n))
        return {"mechanism": self.name} | {
            k: v for k, v in record.items() if k not in ("name", "partition_seed")
        }


def settings_from_options(mechanism: Mechanism[Any], options: Mapping[str, Any]) -> Any:
    """``mechanism``'s settings model validated from command-line ``options`` (field name:
    value): a :class:`ConfigurationError` naming the option it does not have or refuses."""
    model = mechanism.settings
    if model is None:
        raise ConfigurationError(
            f"mechanism {mechanism.name!r} is never created from a request: it has no "
            "settings to calibrate",
            param="mechanism",
        )
    unknown = sorted(k for k in options if k not in model.model_fields)
    if unknown:
        raise ConfigurationError(
            f"--{unknown[0].replace('_', '-')} does not apply to mechanism "
            f"{mechanism.name!r} (its settings: "
            f"{', '.join(k for k in model.model_fields if k != 'name')})",
            param=unknown[0],
        )
    try:
        return model.model_validate({"name": mechanism.name, **options})
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(x) for x in err["loc"]) or "?"
        raise ConfigurationError(
            f"--{name.replace('_', '-')}: {err['msg']} (got {err.get('input')!r})", param=name
        ) from None
