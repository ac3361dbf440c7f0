"""DPS-MOZO's own facts of a setting (:class:`MozoFacts`): the guarantee it is audited in,
the contexts its trials used, the server's (alpha, beta) and eps0, the per-token bound the
white-box finding checks, and where the claim breaks against eps0, why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dpicl_audit.claims import number
from dpicl_audit.jsontypes import JsonObject, JsonValue

__all__ = ["MozoFacts"]


@dataclass(frozen=True)
class MozoFacts:
    """``guarantee``: ``"proven"`` (each token pure 4*eps0-DP, docs/privacy.md) or
    ``"paper"`` (Theorem B.3's nominal claim: ``nominal``); ``max_log_ratio`` eps0 and
    ``per_token_epsilon`` as the contexts report them (proven mode); ``per_token_bound``:
    what a token's white-box check is held to (proven: per_token_epsilon; paper: 4 beta
    alpha). ``epsilon_from_eps0`` and ``calibration_departure``: set only where the claim
    breaks against the reported eps0 (:mod:`.claim`), so an honest run's JSON stays as it
    was."""

    contexts_used: int
    guarantee: str
    alpha: float | None
    beta: float | None
    max_log_ratio: float | None
    per_token_epsilon: float | None
    per_token_bound: float | None
    epsilon_from_eps0: float | None = None
    calibration_departure: str | None = None

    @property
    def nominal(self) -> bool:
        return self.guarantee != "proven"

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "contexts_used": self.contexts_used,
            "nominal": self.nominal,
            "guarantee": self.guarantee,
            "alpha": self.alpha,
            "beta": self.beta,
            "max_log_ratio": self.max_log_ratio,
            "per_token_epsilon": self.per_token_epsilon,
            "per_token_bound": self.per_token_bound,
        }
        if self.calibration_departure is not None:
            out |= {
                "epsilon_from_eps0": self.epsilon_from_eps0,
                "calibration_departure": self.calibration_departure,
            }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> MozoFacts:
        departure = data.get("calibration_departure")
        return cls(
            contexts_used=int(number(data.get("contexts_used")) or 0),
            guarantee=str(data.get("guarantee") or "paper"),
            alpha=number(data.get("alpha")),
            beta=number(data.get("beta")),
            max_log_ratio=number(data.get("max_log_ratio")),
            per_token_epsilon=number(data.get("per_token_epsilon")),
            per_token_bound=number(data.get("per_token_bound")),
            epsilon_from_eps0=number(data.get("epsilon_from_eps0")),
            calibration_departure=None if departure is None else str(departure),
        )
