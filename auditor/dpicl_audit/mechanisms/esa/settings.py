"""ESA's audit settings: voting's partitions, the zero-shot candidates and the answer length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from dpicl_audit.catalog.settings import GaussianSettings

__all__ = ["EsaSettings"]


class EsaSettings(GaussianSettings):
    """Embedding space aggregation (paper 000): a noisy mean of T partitions' embeddings."""

    audit: ClassVar[str] = "dpicl_audit.mechanisms.esa.audit:ESA"
    task: ClassVar[str | None] = "generation"
    attacks: ClassVar[tuple[str, ...]] = ("inquery", "repeat", "reference-vector")
    inquery_designs: ClassVar[bool] = True
    plan_defaults: ClassVar[Mapping[str, object]] = {"dataset": "dialogsum-mini"}

    name: Literal["esa"] = "esa"
    sensitivity: Literal["tight", "original"] = Field(
        default="tight", description="ESA: L2 sensitivity 2/T (tight) or 1 (original)."
    )
    candidates: int = Field(default=8, ge=1, le=64, description="ESA: zero-shot candidates.")
    max_tokens: int = Field(default=64, ge=1, le=1024, description="Tokens per answer.")

    @property
    def answer_tokens(self) -> int | None:
        return self.max_tokens

    def describe(self) -> str:
        return f"{super().describe()}, T_cand={self.candidates}, max_tokens={self.max_tokens}"
