"""ESA as the server serves it: its settings (the schema fragment of ``POST /v1/contexts``),
calibration and cost event (Gaussian at Delta2 = 2/T or 1, :mod:`~dpicl.mechanisms.
partitioned`), pipeline (:mod:`.pipeline`) and white-box view."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from dpicl.domain import Float, Int
from dpicl.mechanisms.base import Answering, Outcome
from dpicl.mechanisms.esa.pipeline import EsaCalibration, EsaOutcome, run_esa
from dpicl.mechanisms.esa.release import esa_sensitivity
from dpicl.mechanisms.partitioned import GaussianMechanism, PartitionedGaussian, gaussian_cost
from dpicl.privacy.ledger import Cost
from dpicl.store.repository import StoredContext


class EsaSettings(PartitionedGaussian):
    """Embedding space aggregation (Algorithm 3 of paper 000, Algorithm 4 of paper 004)."""

    name: Literal["esa"] = "esa"
    sensitivity: Literal["tight", "original"] = Field(
        default="tight",
        description="L2 sensitivity of the mean: 2/T (paper 000, Appendix A) or 1 (original).",
    )
    temperature: Float = Field(default=1.0, ge=0.0, le=10.0)
    candidates: Int = Field(default=8, ge=1, le=64, description="Zero-shot candidates T_cand.")
    max_tokens: Int = Field(default=48, ge=1, le=1024)


class EsaView(BaseModel):
    """ESA's white-box fields."""

    sigma: float = Field(description="The noise's standard deviation per dimension.")
    noisy_mean: list[float]
    candidates: list[str]
    distances: list[float]
    clean_mean: list[float] | None = None
    partition_texts: list[str] | None = None
    partition_embeddings: list[list[float]] | None = None


class Esa(GaussianMechanism[EsaCalibration]):
    """The zero-shot candidate nearest the noisy mean of the partitions' embeddings."""

    name = "esa"
    task = "generation"
    settings = EsaSettings
    calibration = EsaCalibration
    debug_model = EsaView

    def sensitivity(self, settings: Any) -> float:
        return esa_sensitivity(settings.partitions, settings.sensitivity)

    def cost(self, calibration: EsaCalibration) -> Cost:
        return gaussian_cost(calibration)

    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        return await run_esa(
            context,
            query,
            engine=how.runtime.engine,
            embedder=await how.runtime.get_embedder(),
            ledger=how.ledger,
            rng=how.rng,
            max_tokens=how.max_tokens,
        )

    def debug_view(self, outcome: Any, whitebox: str) -> EsaView:
        """The noisy mean, candidates and distances; at ``internal`` also the clean mean and
        each partition's text and embedding."""
        out: EsaOutcome = outcome
        rel = out.release
        view = EsaView(
            sigma=out.sigma,
            noisy_mean=rel.noisy_mean.tolist(),
            candidates=out.candidates,
            distances=rel.distances.tolist(),
        )
        if whitebox != "internal":
            return view
        return view.model_copy(
            update={
                "clean_mean": rel.clean_mean.tolist(),
                "partition_texts": out.partition_texts,
                "partition_embeddings": out.partition_embeddings.tolist(),
            }
        )


ESA = Esa()
