"""One setting (an epsilon) of a run (:class:`SettingResult`): its claims, trials, the
estimate of each threat model and its checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.results.estimate import Estimate
from dpicl_audit.results.rdp import RdpAudit
from dpicl_audit.results.record import COUNT, MAPPING, NUMBER, SAME, TEXT, Codec, Record
from dpicl_audit.verdicts import Verdict

__all__ = ["SettingResult"]

#: The threat models a setting estimates, as stored.
_THREATS = ("black_box", "white_box")
#: The nested records of a setting, by key.
_NESTED: dict[str, type[Estimate] | type[RdpAudit]] = {
    "black_box": Estimate,
    "white_box": Estimate,
    "rdp": RdpAudit,
}


@dataclass(frozen=True)
class SettingResult(Record):
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
    rdp: RdpAudit | None = None
    # Stored JSON, read as it was written (older logs' shapes included).
    conformance: JsonMapping | None = None
    noise_check: JsonMapping | None = None

    CODECS: ClassVar[dict[str, Codec]] = (
        {"setting": TEXT}
        | dict.fromkeys(("epsilon_theory", "epsilon_exact"), NUMBER)
        | dict.fromkeys(("trials", "llm_calls"), COUNT)
        | {"rdp": SAME}
        | dict.fromkeys(("conformance", "noise_check"), MAPPING)
        | dict.fromkeys(_THREATS, SAME)
    )

    @classmethod
    def _typed(cls, data: JsonMapping) -> JsonObject:
        out = super()._typed(data)
        for k, record in _NESTED.items():
            v = data.get(k)
            if isinstance(v, Mapping):
                out[k] = record.from_json(v)
            else:
                out.pop(k, None)  # absent or not an object: kept as stored, in extra
        return out

    def _written(self) -> JsonObject:
        out = super()._written()
        for k in _NESTED:
            found = getattr(self, k)
            out[k] = None if found is None else found.to_json()
        return out

    def estimate(self, threat: str) -> Estimate | None:
        """The estimate of ``"black_box"`` or ``"white_box"``."""
        if threat not in _THREATS:
            raise InvalidAuditInput(f"threat {threat!r}: expected one of {list(_THREATS)}")
        return getattr(self, threat)  # type: ignore[no-any-return]

    @property
    def rdp_verdict(self) -> Verdict | None:
        """The RDP audit's verdict, where the setting has one."""
        return None if self.rdp is None else self.rdp.verdict

    def verdicts(self) -> list[Verdict]:
        """Every verdict of the setting: black-box, white-box, RDP."""
        found = [e.verdict for e in (self.black_box, self.white_box) if e is not None]
        return [v for v in (*found, self.rdp_verdict) if v is not None]
