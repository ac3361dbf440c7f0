"""ESA (Algorithm 3 of paper 000) as a request pipeline.

query -> T partition prompts + T_cand zero-shot prompts (ONE engine batch) -> texts ->
one embedder batch -> noisy mean of the partition embeddings -> nearest zero-shot candidate.
Only the zero-shot candidates can be released, so the released text never quotes an exemplar
except through the DP-noised choice among public candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpicl.engines.base import Embedder, Engine, GenerationParams
from dpicl.mechanisms.esa.release import EsaRelease, esa_release
from dpicl.mechanisms.partitioned import GaussianCalibration, gaussian_cost
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.pipelines.partitions import partition_prompts, zero_shot_prompt
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.privacy.randomness import entropy_seed
from dpicl.store.repository import StoredContext


class EsaCalibration(GaussianCalibration):
    """An ESA context's stored record, typed (its fields in the order stored: the derived
    L2 ``sensitivity`` where the setting's name for it was)."""

    name: Literal["esa"] = "esa"
    sensitivity: float
    temperature: float
    candidates: int
    max_tokens: int
    sigma: float
    epsilon_exact: float | None = None


@dataclass(frozen=True, slots=True)
class EsaOutcome:
    context: StoredContext
    text: str
    release: EsaRelease
    partition_texts: list[str]
    partition_embeddings: np.ndarray
    candidates: list[str]
    sigma: float
    cost: Cost
    budget: BudgetStatus
    finish_reason: Literal["stop", "length"] = "stop"
    completion_tokens: int = 0  # the candidate is released whole


async def _generate_and_embed(
    engine: Engine,
    embedder: Embedder,
    context: StoredContext,
    query: str,
    cal: EsaCalibration,
    max_tokens: int,
) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    parts = partition_prompts(context, query)
    zero = zero_shot_prompt(context, query)
    # One batch: the T partition generations and the T_cand zero-shot candidates. The
    # sampler seed is fresh OS entropy per request (it is not DP noise; see DESIGN.md 4).
    texts = await engine.generate(
        [*parts, *([zero] * cal.candidates)],
        GenerationParams(max_tokens=max_tokens, temperature=cal.temperature, seed=entropy_seed()),
    )
    part_texts, cand_texts = texts[: len(parts)], texts[len(parts) :]
    emb = await embedder.embed([*part_texts, *cand_texts])
    return part_texts, cand_texts, emb[: len(parts)], emb[len(parts) :]


async def run_esa(
    context: StoredContext,
    query: str,
    *,
    engine: Engine,
    embedder: Embedder,
    ledger: Ledger,
    rng: np.random.Generator,
    max_tokens: int | None = None,
) -> EsaOutcome:
    """One ESA answer on ``context``, by its calibration (parsed once per context)."""
    cal = context.record_as(EsaCalibration)
    cost = gaussian_cost(cal)
    tokens = max_tokens or cal.max_tokens
    charged, (part_texts, cand_texts, part_emb, cand_emb) = await paid_engine_call(
        ledger,
        context,
        cost,
        engine.name,
        _generate_and_embed(engine, embedder, context, query, cal, tokens),
    )
    sigma = cal.sigma
    release = esa_release(part_emb, cand_emb, sigma, rng)
    return EsaOutcome(
        context=charged,
        text=cand_texts[release.index],
        release=release,
        partition_texts=part_texts,
        partition_embeddings=part_emb,
        candidates=cand_texts,
        sigma=sigma,
        cost=cost,
        budget=Ledger.status(charged, cost),
    )
