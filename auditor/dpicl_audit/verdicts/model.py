"""The one verdict type: :class:`Verdict` (and :class:`GaussianVerdict`, a Gaussian claim's,
with the rule's reasons and advice), its :class:`Status` (severity, exit code), the run's
family of tests, and a run's worst status (a run's exit code:
:func:`dpicl_audit.results.results_exit_code`). :meth:`Verdict.to_dict` is the
JSON stored under an estimate's ``"verdict"``; :meth:`Verdict.from_dict` reads every stored
shape back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar, Literal, get_args

from dpicl_audit.claims import Family
from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping, JsonObject

__all__ = [
    "EXIT_CODES",
    "STATUS_ORDER",
    "Family",
    "GaussianVerdict",
    "Status",
    "Verdict",
    "Word",
    "worst_status",
]


class Status(StrEnum):
    """A verdict's status, as the JSON writes it (``"status"``), most severe first."""

    VIOLATION = "violation"
    BUG = "bug"
    NONCONFORMING = "nonconforming"
    INCONCLUSIVE = "inconclusive"
    OK = "ok"
    ERROR = "error"

    @property
    def order(self) -> int:
        """Severity, for the worst status of a run (violation 5 ... error 0)."""
        return _ORDER[self]

    @property
    def exit_code(self) -> int:
        """The exit status of ``dpicl-audit run``, ``bootstrap`` and ``report`` for a run
        whose worst verdict this is (:data:`EXIT_CODES`; 0 for ok and error)."""
        return EXIT_CODES.get(self, 0)

    @property
    def flags(self) -> bool:
        """A VIOLATION or BUG: a claim or the exact value broken."""
        return self in (Status.VIOLATION, Status.BUG)

    @classmethod
    def of(cls, word: object) -> Status:
        """The status a stored verdict names ("" or none: error, a verdict not reached)."""
        try:
            return cls(str(word or "error"))
        except ValueError:
            raise InvalidAuditInput(
                f"verdict status {word!r}: expected one of {[s.value for s in cls]}"
            ) from None


_ORDER = {
    Status.VIOLATION: 5,
    Status.BUG: 4,
    Status.NONCONFORMING: 3,
    Status.INCONCLUSIVE: 2,
    Status.OK: 1,
    Status.ERROR: 0,
}
#: Severity of a status, for the worst status of a run (a status as its word; "" none).
STATUS_ORDER: dict[str, int] = {s.value: s.order for s in Status} | {"": 0}

#: The exit status of ``dpicl-audit run``, ``bootstrap`` and ``report`` by a run's worst
#: verdict, for a deployment pipeline to fail on (docs/auditing.md, "Exit codes"). 1 is an
#: error and 2 a usage error (click's), so the verdicts start at 3.
EXIT_CODES: dict[str, int] = {"violation": 5, "bug": 5, "nonconforming": 4, "inconclusive": 3}

#: The word of a rule's decision (:data:`~dpicl_audit.estimators.verdict_rules.RuleWord`)
#: or of a conformance finding, stored under ``"verdict"``.
Word = Literal["VIOLATION", "BUG", "INCONCLUSIVE", "CONSISTENT", "NONCONFORMING"]
_WORDS: tuple[str, ...] = get_args(Word)


def _strings(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise InvalidAuditInput(f"verdict {key!r}: expected a list, got {value!r}")
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class Verdict:
    """What an estimate's lower bound says about the claims: the one verdict type of the
    auditor. Stored as the JSON object under an estimate's ``"verdict"`` (:meth:`to_dict`,
    :meth:`from_dict`: a stored verdict round-trips exactly, keys this type does not know
    kept in ``extra``).

    ``violation`` None: a verdict not reached (``error``), which states neither claim.
    ``word``: the rule's word (Gaussian verdicts, and a NONCONFORMING reading of any).
    ``family_wise``: the figures with each test at the run's corrected error; ``together``:
    the verdict was judged for the run's tests together (the key is written even where
    those figures could not be had)."""

    status: Status
    message: str
    violation: bool | None = None
    exceeds_exact: bool | None = None
    word: Word | None = None
    family_wise: Mapping[str, Any] | None = None
    together: bool = False
    nonconforming: tuple[str, ...] | None = None
    extra: JsonMapping = field(default_factory=dict)

    #: The JSON keys this type reads (the rest go to ``extra``).
    KEYS: ClassVar[tuple[str, ...]] = (
        "status",
        "verdict",
        "violation",
        "exceeds_exact",
        "message",
        "family_wise",
        "nonconforming",
    )

    @property
    def flags(self) -> bool:
        """A VIOLATION or BUG."""
        return self.status.flags

    def to_dict(self) -> JsonObject:
        """The JSON object stored under an estimate's ``"verdict"``."""
        out: JsonObject = {"status": self.status.value}
        if self.word is not None:
            out["verdict"] = self.word
        if self.violation is not None:
            out["violation"] = self.violation
            out["exceeds_exact"] = self.exceeds_exact
        out["message"] = self.message
        out |= self._fields()
        if self.together or self.family_wise is not None:
            out["family_wise"] = None if self.family_wise is None else dict(self.family_wise)
        if self.nonconforming is not None:
            out["nonconforming"] = list(self.nonconforming)
        return out | dict(self.extra)

    def _fields(self) -> JsonObject:
        return {}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Verdict:
        """A stored verdict (a :class:`GaussianVerdict` where it carries the rule's
        reasons); refuses one without a status or message."""
        if not isinstance(data, Mapping) or "status" not in data:
            raise InvalidAuditInput(f"a verdict needs a status, got {data!r}")
        cls = GaussianVerdict if "reasons" in data else Verdict
        word = data.get("verdict")
        if word is not None and word not in _WORDS:
            raise InvalidAuditInput(f"verdict word {word!r}: expected one of {list(_WORDS)}")
        nonconforming = data.get("nonconforming")
        fw = data.get("family_wise")
        common: dict[str, Any] = dict(
            status=Status.of(data["status"]),
            message=str(data.get("message", "")),
            violation=data.get("violation") if "violation" in data else None,
            exceeds_exact=data.get("exceeds_exact"),
            word=word,
            family_wise=None if fw is None else dict(fw),
            together="family_wise" in data,
            nonconforming=None
            if nonconforming is None
            else _strings(nonconforming, "nonconforming"),
            extra={k: v for k, v in data.items() if k not in cls.KEYS},
        )
        if cls is Verdict:
            return Verdict(**common)
        needed = data.get("trials_needed")
        return GaussianVerdict(
            **common,
            reasons=_strings(data.get("reasons") or [], "reasons"),
            advice=_strings(data.get("advice") or [], "advice"),
            max_reachable=None if data.get("max_reachable") is None else data["max_reachable"],
            trials_needed=None if needed is None else (int(needed[0]), int(needed[1])),
        )

    def read_with(self, conformance: JsonMapping | None) -> Verdict:
        """This verdict read with a setting's ``conformance`` (estimators.conformance): a
        NONCONFORMING finding replaces CONSISTENT and INCONCLUSIVE (a VIOLATION or BUG
        stays, naming it too)."""
        if not conformance or conformance.get("status") != "nonconforming":
            return self
        found = conformance.get("differs")
        differs = [str(d) for d in found] if isinstance(found, list | tuple) else []
        note = f"NONCONFORMING ({', '.join(differs)}): {conformance.get('message')}"
        if self.flags:
            return replace(self, message=f"{self.message}; also {note}")
        return replace(
            self,
            status=Status.NONCONFORMING,
            word="NONCONFORMING",
            violation=False,
            exceeds_exact=False,
            message=note + " (the server does not release what the mechanism it reports would)",
            nonconforming=tuple(differs),
        )


@dataclass(frozen=True)
class GaussianVerdict(Verdict):
    """The verdict of a Gaussian claim (voting, ESA; :func:`gaussian_verdict`): with the
    rule's reasons and advice, the epsilon the design could reach, and the trials [with the
    canary, without] about reaching the power it lacked."""

    together: bool = True  # its family_wise is always written, None for a lone test
    reasons: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()
    max_reachable: float | None = None
    trials_needed: tuple[int, int] | None = None

    KEYS: ClassVar[tuple[str, ...]] = (
        *Verdict.KEYS,
        "reasons",
        "advice",
        "max_reachable",
        "trials_needed",
    )

    def _fields(self) -> JsonObject:
        return {
            "reasons": list(self.reasons),
            "advice": list(self.advice),
            "max_reachable": self.max_reachable,
            "trials_needed": None if self.trials_needed is None else list(self.trials_needed),
        }


def worst_status(statuses: Iterable[str]) -> Status:
    """violation > bug > nonconforming > inconclusive > ok > error; error when there is
    nothing."""
    return max(map(Status.of, statuses), key=lambda s: s.order, default=Status.ERROR)
