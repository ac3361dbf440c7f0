"""DPS-MOZO's audit settings: |D|, the shots per token, top-k and the claim audited."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field

from dpicl_audit.catalog.settings import MechanismSettings, PlanView

__all__ = ["MozoSettings"]


class MozoSettings(MechanismSettings):
    """DPS-MOZO (paper 004): tokens sampled from mixed one-shot products over |D| exemplars."""

    audit: ClassVar[str] = "dpicl_audit.mechanisms.dps_mozo.audit:MOZO"
    task: ClassVar[str | None] = "generation"
    plan_defaults: ClassVar[Mapping[str, object]] = {"dataset": "dialogsum-mini"}
    # Plans stored before DPS-MOZO had a proven mode audited the paper's mode.
    stored_defaults: ClassVar[Mapping[str, object]] = {"guarantee": "paper"}

    name: Literal["dps-mozo"] = "dps-mozo"
    # The audit reads the first tokens only (T_max = 2).
    max_tokens: int = Field(default=2, ge=1, le=1024, description="Tokens per answer.")
    exemplars: int = Field(default=4, ge=1, le=10_000, description="|D|.")
    n_shots: int | None = Field(
        default=None, ge=1, le=10_000, description="Shots per token (None: |D|)."
    )
    top_k: int = Field(default=100, ge=1, le=100_000, description="top-k.")
    guarantee: Literal["proven", "paper"] = Field(
        default="proven", description="proven (max-log-ratio, a true claim) | paper (nominal)."
    )
    alpha: int | None = Field(default=None, ge=2, le=1024, description="(paper mode) Renyi order.")
    queries_per_context: int = Field(default=1, ge=1, le=100_000, description="Answers/context.")

    @property
    def n_exemplars(self) -> int:
        return self.exemplars

    @property
    def answer_tokens(self) -> int | None:
        return self.max_tokens

    def check_plan(self, plan: PlanView) -> None:
        super().check_plan(plan)
        if self.n_shots is not None and self.n_shots > self.exemplars:
            raise ValueError(
                f"mechanism.n_shots {self.n_shots} exceeds mechanism.exemplars {self.exemplars}"
            )
        if self.alpha is not None and self.guarantee != "paper":
            raise ValueError(
                f"mechanism.alpha {self.alpha} applies only to mechanism.guarantee = 'paper' "
                "(the proven mode has no Renyi order)"
            )

    def describe(self) -> str:
        return (
            f"{self.name}, |D|={self.exemplars}, n_shots={self.n_shots or self.exemplars}, "
            f"top_k={self.top_k}, max_tokens={self.max_tokens}, {self.queries_per_context} "
            f"queries per context, delta={self.delta:g}"
        )

    def design_text(self, plan: Any) -> str | None:
        return f"signal canary ({'/'.join(plan.mozo.signals)})"
