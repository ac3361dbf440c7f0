"""A run's results, typed: :class:`RunResult` (the run), :class:`SettingResult` (one
epsilon), :class:`Estimate` (one threat model's figures and verdict, or its error).

The one edge between the results and their JSON (issue 28, item 2): :meth:`RunResult.from_json`
reads any stored shape (today's, and those the legacy upgrade gives, :mod:`.legacy`) and
:meth:`RunResult.to_json` writes it back exactly, keys in their stored order: a key this
module does not type (a mechanism's own facts, a newer auditor's) is kept in ``extra``, and a
typed key that was absent stays absent. Non-finite floats, stored as ``"inf"``/``"nan"``
strings (:func:`~dpicl_audit.pipeline.results.jsonable`), read as floats and write back as
those strings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.verdicts import Status, Verdict, worst_status

__all__ = ["Estimate", "RunResult", "SettingResult", "results_exit_code"]

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _number(value: Any) -> float | None:
    """A stored number: ints stay ints (the JSON keeps its type), strings name non-finite."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    raise InvalidAuditInput(f"expected a number, got {value!r}")


def _number_json(value: float | None) -> Any:
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _count(value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise InvalidAuditInput(f"expected a whole number, got {value!r}")


#: What a codec reads from a value of an older shape: the key stays as stored, in ``extra``.
_UNTYPED = object()


def _text(value: Any) -> Any:
    """A name (an id, a kind): anything else is an older shape (the DPS-MOZO audit before
    issue 9 stored its mechanism as an object), kept as stored."""
    return value if value is None or isinstance(value, str) else _UNTYPED


def _same(value: Any) -> Any:
    return value


def _mapping(value: Any) -> Mapping[str, Any] | None:
    if value is None or isinstance(value, Mapping):
        return value
    raise InvalidAuditInput(f"expected an object, got {value!r}")


#: (read, write) of a typed key's stored value.
_Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]
_NUMBER: _Codec = (_number, _number_json)
_COUNT: _Codec = (_count, _same)
_TEXT: _Codec = (_text, _same)
_MAPPING: _Codec = (_mapping, _same)


@dataclass(frozen=True)
class _Record:
    """A typed JSON object: the fields named in ``CODECS`` (key: (read, write)), the rest
    in ``extra``; ``keys``: the stored keys in order (a typed field not among them is
    written only where it has a value)."""

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True)
    keys: tuple[str, ...] = field(default=(), kw_only=True, compare=False, repr=False)

    CODECS: ClassVar[dict[str, _Codec]] = {}

    @classmethod
    def _typed(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """The typed fields of ``data`` (subclasses add their nested records)."""
        read_ = {k: read(data[k]) for k, (read, _) in cls.CODECS.items() if k in data}
        return {k: v for k, v in read_.items() if v is not _UNTYPED}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """Read a stored object (:class:`InvalidAuditInput` naming a value of the wrong
        type)."""
        if not isinstance(data, Mapping):
            raise InvalidAuditInput(f"{cls.__name__}: expected an object, got {data!r}")
        known = {f.name for f in fields(cls)}
        typed = cls._typed(data)
        extra = {k: v for k, v in data.items() if k not in typed}  # the keys not typed
        return cls(**{k: v for k, v in typed.items() if k in known}, extra=extra, keys=tuple(data))

    def _written(self) -> dict[str, Any]:
        """Every typed field as stored (subclasses write their nested records)."""
        return {k: write(getattr(self, k, None)) for k, (_, write) in self.CODECS.items()}

    def to_json(self) -> dict[str, Any]:
        """The JSON object, as stored (exactly what :meth:`from_json` read)."""
        typed = self._written()
        out: dict[str, Any] = {}
        for k in self.keys:
            out[k] = self.extra[k] if k in self.extra else typed[k]
        for k, v in typed.items():
            if k not in out and v is not None:
                out[k] = v
        return out | {k: v for k, v in self.extra.items() if k not in out}


@dataclass(frozen=True)
class Estimate(_Record):
    """One threat model's estimate of a setting: its counts, lower bounds and verdict
    (:mod:`~dpicl_audit.estimators.counts`, :mod:`~dpicl_audit.estimators.whitebox`), or
    the ``error`` that stopped it. The figures a mechanism adds (thresholds, held-out
    splits, the ROC) are in ``extra``."""

    tp: int | None = None
    fn: int | None = None
    fp: int | None = None
    tn: int | None = None
    confidence: float | None = None
    delta: float | None = None
    mu_lower: float | None = None
    epsilon_lower: float | None = None
    epsilon_lower_classic: float | None = None
    epsilon_emp: float | None = None
    tpr: float | None = None
    fpr: float | None = None
    verdict: Verdict | None = None
    error: str | None = None

    CODECS: ClassVar[dict[str, _Codec]] = {
        **{k: _COUNT for k in ("tp", "fn", "fp", "tn")},
        **{
            k: _NUMBER
            for k in (
                "confidence",
                "delta",
                "mu_lower",
                "epsilon_lower",
                "epsilon_lower_classic",
                "epsilon_emp",
                "tpr",
                "fpr",
            )
        },
        "error": _TEXT,
        "verdict": (lambda v: None if v is None else Verdict.from_dict(v), _same),
    }

    def _written(self) -> dict[str, Any]:
        out = super()._written()
        out["verdict"] = None if self.verdict is None else self.verdict.to_dict()
        return out

    @property
    def status(self) -> str:
        """The verdict's status; ``error`` for an estimate that failed, "" for one with no
        verdict (as the report's rows read it)."""
        if self.error is not None:
            return Status.ERROR.value
        return "" if self.verdict is None else self.verdict.status.value

    @property
    def epsilon_shown(self) -> float | None:
        """The epsilon the table shows: epsilon_emp where the mechanism states one, else the
        GDP lower bound."""
        return self.epsilon_emp if "epsilon_emp" in self.keys else self.epsilon_lower


_THREATS = ("black_box", "white_box")


@dataclass(frozen=True)
class SettingResult(_Record):
    """One setting (an epsilon) of a run: its claims, trials, the estimate of each threat
    model, the RDP audit's block (``rdp``, with its verdict), the conformance and noise
    checks. Each mechanism's own facts (partitions, sigma, release rates, signals, ...)
    are in ``extra``."""

    setting: str | None = None
    epsilon_theory: float | None = None
    epsilon_exact: float | None = None
    trials: int | None = None
    llm_calls: int | None = None
    black_box: Estimate | None = None
    white_box: Estimate | None = None
    rdp: Mapping[str, Any] | None = None
    conformance: Mapping[str, Any] | None = None
    noise_check: Mapping[str, Any] | None = None

    CODECS: ClassVar[dict[str, _Codec]] = {
        "setting": _TEXT,
        "epsilon_theory": _NUMBER,
        "epsilon_exact": _NUMBER,
        "trials": _COUNT,
        "llm_calls": _COUNT,
        "rdp": _MAPPING,
        "conformance": _MAPPING,
        "noise_check": _MAPPING,
        **{k: (_same, _same) for k in _THREATS},
    }

    @classmethod
    def _typed(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._typed(data)
        for k in _THREATS:
            v = data.get(k)
            if isinstance(v, Mapping):
                out[k] = Estimate.from_json(v)
            else:
                out.pop(k, None)  # absent or not an estimate: kept as stored, in extra
        return out

    def _written(self) -> dict[str, Any]:
        out = super()._written()
        for k in _THREATS:
            est = getattr(self, k)
            out[k] = None if est is None else est.to_json()
        return out

    def estimate(self, threat: str) -> Estimate | None:
        """The estimate of ``"black_box"`` or ``"white_box"``."""
        if threat not in _THREATS:
            raise InvalidAuditInput(f"threat {threat!r}: expected one of {list(_THREATS)}")
        return getattr(self, threat)  # type: ignore[no-any-return]

    @property
    def rdp_verdict(self) -> Verdict | None:
        """The RDP audit's verdict, where the setting has one."""
        found = (self.rdp or {}).get("verdict")
        return Verdict.from_dict(found) if isinstance(found, Mapping) else None

    def verdicts(self) -> list[Verdict]:
        """Every verdict of the setting: black-box, white-box, RDP."""
        found = [e.verdict for e in (self.black_box, self.white_box) if e is not None]
        return [v for v in (*found, self.rdp_verdict) if v is not None]


@dataclass(frozen=True)
class RunResult(_Record):
    """A run's results: what ``run --json`` prints, the trial log stores and ``show`` and
    ``report`` read back. ``verify``: a ``--profile verify`` run's tail-gap companion."""

    run_id: str | None = None
    kind: str | None = None
    status: str | None = None
    mechanism: str | None = None
    confidence: float | None = None
    delta: float | None = None
    settings: tuple[SettingResult, ...] = ()
    ledger: Mapping[str, Any] | None = None
    tail_gap: RunResult | None = None
    queries: int | None = None
    llm_calls: int | None = None
    wall_time_s: float | None = None

    CODECS: ClassVar[dict[str, _Codec]] = {
        "run_id": _TEXT,
        "kind": _TEXT,
        "status": _TEXT,
        "mechanism": _TEXT,
        "confidence": _NUMBER,
        "delta": _NUMBER,
        "ledger": _MAPPING,
        "queries": _COUNT,
        "llm_calls": _COUNT,
        "wall_time_s": _NUMBER,
        "settings": (_same, _same),
        "verify": (_same, _same),
    }

    @classmethod
    def _typed(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        out = super()._typed(data)
        settings = data.get("settings")
        if isinstance(settings, list) and all(isinstance(s, Mapping) for s in settings):
            out["settings"] = tuple(SettingResult.from_json(s) for s in settings)
        else:
            out.pop("settings", None)  # a legacy shape: kept as stored, in extra
        verify = data.get("verify")
        out.pop("verify", None)
        if isinstance(verify, Mapping) and set(verify) == {"tail_gap"}:
            out["verify"] = None  # typed: written back from tail_gap
            out["tail_gap"] = RunResult.from_json(verify["tail_gap"])
        return out

    def _written(self) -> dict[str, Any]:
        out = super()._written()
        listed = self.settings or "settings" in self.keys
        out["settings"] = [s.to_json() for s in self.settings] if listed else None
        out["verify"] = None if self.tail_gap is None else {"tail_gap": self.tail_gap.to_json()}
        return out

    @property
    def threat_models(self) -> list[str]:
        """The threat models the run estimated (empty where the results do not say)."""
        return list(self.extra.get("threat_models") or [])

    @property
    def design(self) -> Mapping[str, Any]:
        """The mechanism's summary of the run's design (:meth:`~dpicl_audit.mechanisms.base.
        MechanismAudit.summary`); empty where none was stored."""
        found = self.extra.get("design")
        return found if isinstance(found, Mapping) else {}

    @property
    def server(self) -> Mapping[str, Any]:
        """The server's /healthz as the run recorded it (``versions.server``)."""
        versions = self.extra.get("versions")
        found = versions.get("server") if isinstance(versions, Mapping) else None
        return found if isinstance(found, Mapping) else {}

    @property
    def family_size(self) -> int | None:
        """How many figures the run's claims hold for together (:mod:`~dpicl_audit.
        estimators.family`); None for a run estimated before claims were stated per run."""
        family = self.extra.get("family")
        return family.get("size") if isinstance(family, Mapping) else None

    def verdicts(self) -> list[Verdict]:
        """Every verdict of the run's settings."""
        return [v for s in self.settings for v in s.verdicts()]

    def statuses(self) -> list[Status]:
        """Every status that decides the run's exit code: its verdicts', and NONCONFORMING
        where the ledger departs from its own reported costs."""
        out = [v.status for v in self.verdicts()]
        if (self.ledger or {}).get("status") == "nonconforming":
            out.append(Status.NONCONFORMING)
        return out


def results_exit_code(results: Sequence[RunResult | Mapping[str, Any]]) -> int:
    """The exit status for these runs' results (typed, or as stored): :data:`~dpicl_audit.
    verdicts.EXIT_CODES` of the worst of their :meth:`RunResult.statuses`, else 0 (every
    figure consistent, or no verdict at all)."""
    runs = [r if isinstance(r, RunResult) else RunResult.from_json(r) for r in results]
    return worst_status([st for r in runs for st in r.statuses()]).exit_code
