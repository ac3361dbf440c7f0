"""A setting's claims (:class:`SettingClaims`): what an epsilon setting of a run states about
the mechanism (the configured epsilon and delta, the noise sigma the server reports with its
sensitivity, the exact epsilons of the auditor and of the server, the design's release
rates), the run's family of tests, and the facts of the audited mechanism itself (a small
frozen dataclass of its own: :class:`MechanismFacts`).

The mechanisms build it (``MechanismAudit.setting_claims``), the estimators, the verdicts and
the report read it by attribute. It is stored flat, among the setting's results (the keys
of ``results.json`` a setting has had since before issue 28): :meth:`SettingClaims.to_json`
writes exactly those keys, :meth:`SettingClaims.from_json` reads them back (a stored run's
setting, or the mapping an audit registered from outside returns).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol, Self, TypeVar

from dpicl_audit.context_info import ContextInfo
from dpicl_audit.errors import InvalidAuditInput, TargetProtocolError
from dpicl_audit.jsontypes import JsonObject, JsonValue

__all__ = [
    "NO_FACTS",
    "ContextIds",
    "Family",
    "MechanismFacts",
    "SettingClaims",
    "StoredFacts",
    "number",
    "sigma_of",
]

#: The contexts of a setting by world (``"C1"``, ``"C0"``): one id (None before it exists),
#: or the ids of every context of the world where its trials are spread over several.
ContextIds = Mapping[str, str | list[str] | None]

F = TypeVar("F", bound="MechanismFacts")


def number(value: object) -> float | None:
    """A stored or reported number (an int stays one, as the JSON had it; ``"inf"`` and
    ``"nan"``, as :func:`dpicl_audit.results.jsonable` writes them, read as floats; None
    stays None); anything else is refused, naming it."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if not isinstance(value, str):
        raise InvalidAuditInput(f"expected a number, got {value!r}")
    try:
        return float(value)
    except ValueError as exc:
        raise InvalidAuditInput(f"expected a number, got {value!r}") from exc


@dataclass(frozen=True)
class Family:
    """The run's family of tests (set by ``pipeline.estimation.estimate_run``): its ``size``
    figures hold together at ``confidence`` (estimators.family), over ``settings``
    settings."""

    size: int
    confidence: float
    settings: int = 1

    def to_json(self) -> JsonObject:
        return {"size": self.size, "confidence": self.confidence, "settings": self.settings}

    @classmethod
    def from_json(cls, data: object) -> Family | None:
        """The stored family (None where the setting has none)."""
        if not isinstance(data, Mapping):
            return None
        return cls(
            int(data.get("size") or 1),
            float(data.get("confidence") or 0.95),
            int(data.get("settings") or 1),
        )


class MechanismFacts(Protocol):
    """The audited mechanism's own facts of a setting (DPS-MOZO's per-token bound, ESA's
    signal geometry, ...): a frozen dataclass written among the setting's keys."""

    def to_json(self) -> JsonObject: ...


@dataclass(frozen=True)
class StoredFacts:
    """A mechanism's facts as stored, not typed by its audit: the keys of a stored setting
    that :class:`SettingClaims` does not read, or of the mapping an audit registered from
    outside returns. A free-form JSON object, at that edge only."""

    values: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return dict(self.values)

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> StoredFacts:
        return cls(dict(data))


#: A setting without facts of its mechanism's own.
NO_FACTS = StoredFacts()

#: The keys every setting's JSON has, null or not.
_ALWAYS = ("setting", "epsilon_theory", "delta", "context_ids", "sigma", "epsilon_exact")
#: The keys written where they have a value, or where the producer states them unknown
#: (:attr:`SettingClaims.nulls`).
_OPTIONAL = (
    "sensitivity",
    "epsilon_exact_server",
    "epsilon_exact_signal",
    "epsilon_exact_release",
    "release_rates",
    "flip_rate",
)


@dataclass(frozen=True)
class SettingClaims:
    """What one epsilon setting claims, and the facts its verdicts are read with."""

    #: The setting's key (``plan.setting_key``).
    setting: str
    #: The configured (claimed) epsilon and the run's delta.
    epsilon_theory: float
    delta: float
    #: The setting's contexts by world.
    context_ids: ContextIds = field(default_factory=dict)
    #: The noise the server reports (Gaussian mechanisms), None where it has none.
    sigma: float | None = None
    #: The auditor's exact epsilon of the mechanism's curve at the worst case.
    epsilon_exact: float | None = None
    #: The sensitivity and the exact epsilon the server itself reports.
    sensitivity: float | None = None
    epsilon_exact_server: float | None = None
    #: The exact epsilon of the shift an attack on the canary sees at most (ESA: its actual
    #: embedding shift ``D / T``); None: the worst case.
    epsilon_exact_signal: float | None = None
    #: The released answer's own exact epsilon at the design's clean votes (the ceiling of
    #: the assumption-free black-box bound), and its release rates [with, without].
    epsilon_exact_release: float | None = None
    release_rates: tuple[float, float] | None = None
    #: What the verdicts read where a design's figures are known below the worst case:
    #: the design's own exact epsilon, and whether it is a Gaussian mechanism's. Never
    #: stored (the verdict's reference only).
    epsilon_exact_design: float | None = None
    epsilon_exact_design_gaussian: bool = False
    #: The fraction of clean vote pairs that differ between worlds (a bootstrap's, which
    #: its results store; the power of a threshold on scores, estimators.power).
    flip_rate: float | None = None
    #: The run's family of tests, and whether the server is the rule-following simulator.
    family: Family | None = None
    simulator: bool = False
    #: The mechanism's own facts.
    facts: MechanismFacts = NO_FACTS
    #: The optional keys written as null where unset: the producer states them unknown (the
    #: JSON as every version wrote it).
    nulls: frozenset[str] = frozenset()

    STORED: ClassVar[tuple[str, ...]] = (*_ALWAYS, *_OPTIONAL, "family", "simulator")

    def own(self, kind: type[F]) -> F:
        """The mechanism's facts, as the audit that made them types them."""
        if not isinstance(self.facts, kind):
            raise InvalidAuditInput(
                f"setting {self.setting}: its facts are {type(self.facts).__name__}, "
                f"expected {kind.__name__}"
            )
        return self.facts

    def with_family(self, family: Family, *, simulator: bool) -> Self:
        return replace(self, family=family, simulator=simulator)

    def with_design_reference(self, epsilon: float, *, gaussian: bool) -> Self:
        """The claims a verdict reads with the design's own exact epsilon as the BUG
        reference (issue 27)."""
        return replace(self, epsilon_exact_design=epsilon, epsilon_exact_design_gaussian=gaussian)

    def context_id_set(self) -> frozenset[str]:
        """Every context id of the setting, of both worlds."""
        out: set[str] = set()
        for found in self.context_ids.values():
            out.update([found] if isinstance(found, str) else (found or []))
        return frozenset(out)

    def to_json(self) -> JsonObject:
        """The setting's claims as stored among its results."""
        out: JsonObject = {
            "setting": self.setting,
            "epsilon_theory": self.epsilon_theory,
            "delta": self.delta,
            "context_ids": {
                k: list(v) if isinstance(v, list) else v for k, v in self.context_ids.items()
            },
            "sigma": self.sigma,
            "epsilon_exact": self.epsilon_exact,
        }
        for key in _OPTIONAL:
            value = getattr(self, key)
            if value is not None or key in self.nulls:
                out[key] = list(value) if isinstance(value, tuple) else value
        out |= self.facts.to_json()
        if self.family is not None:
            out |= {"family": self.family.to_json(), "simulator": self.simulator}
        return out

    @classmethod
    def from_json(
        cls,
        data: Mapping[str, JsonValue],
        facts: Callable[[Mapping[str, JsonValue]], MechanismFacts] = StoredFacts.from_json,
    ) -> SettingClaims:
        """A setting's claims from its stored keys (the rest of them are the mechanism's:
        ``facts`` reads them)."""
        if not isinstance(data, Mapping) or "epsilon_theory" not in data:
            raise InvalidAuditInput(f"a setting's claims need epsilon_theory; got {data!r}")
        ids = data.get("context_ids")
        rates = data.get("release_rates")

        def num(key: str) -> float | None:
            return number(data.get(key))

        return cls(
            setting=str(data.get("setting")),
            epsilon_theory=float(num("epsilon_theory") or 0.0),
            delta=float(num("delta") or 0.0),
            context_ids=_context_ids(ids),
            sigma=num("sigma"),
            epsilon_exact=num("epsilon_exact"),
            sensitivity=num("sensitivity"),
            epsilon_exact_server=num("epsilon_exact_server"),
            epsilon_exact_signal=num("epsilon_exact_signal"),
            epsilon_exact_release=num("epsilon_exact_release"),
            release_rates=(
                (float(number(rates[0]) or 0.0), float(number(rates[1]) or 0.0))
                if isinstance(rates, list) and len(rates) == 2
                else None
            ),
            flip_rate=num("flip_rate"),
            family=Family.from_json(data.get("family")),
            simulator=bool(data.get("simulator")),
            facts=facts({k: v for k, v in data.items() if k not in cls.STORED}),
            nulls=frozenset(k for k in _OPTIONAL if k in data and data[k] is None),
        )


def _context_ids(stored: JsonValue) -> dict[str, str | list[str] | None]:
    """The stored ``context_ids`` (one id or a list of them per world; anything else: none)."""
    if not isinstance(stored, Mapping):
        return {}
    out: dict[str, str | list[str] | None] = {}
    for world, found in stored.items():
        if isinstance(found, list):
            out[world] = [str(c) for c in found]
        else:
            out[world] = None if found is None else str(found)
    return out


def sigma_of(info: ContextInfo) -> float:
    """The noise sigma a Gaussian mechanism's context reports (voting, ESA)."""
    try:
        sigma = float(info["mechanism"]["sigma"])
    except (TypeError, KeyError, ValueError) as exc:
        raise TargetProtocolError(
            f"context {info.get('id')} reports no mechanism.sigma; the audit needs the noise "
            "the server uses"
        ) from exc
    if not (sigma > 0 and math.isfinite(sigma)):
        raise TargetProtocolError(f"context {info.get('id')} reports sigma {sigma}")
    return sigma
