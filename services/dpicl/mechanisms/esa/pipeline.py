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
from dpicl.mechanisms.partitioned import gaussian_cost
from dpicl.pipelines.engine_calls import paid_engine_call
from dpicl.pipelines.partitions import partition_prompts, zero_shot_prompt
from dpicl.privacy.ledger import BudgetStatus, Cost, Ledger
from dpicl.privacy.randomness import entropy_seed
from dpicl.store.repository import StoredContext


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
    max_tokens: int,
) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    m = context.mechanism
    parts = partition_prompts(context, query)
    zero = zero_shot_prompt(context, query)
    n_cand = int(m["candidates"])
    # One batch: the T partition generations and the T_cand zero-shot candidates. The
    # sampler seed is fresh OS entropy per request (it is not DP noise; see DESIGN.md 4).
    texts = await engine.generate(
        [*parts, *([zero] * n_cand)],
        GenerationParams(
            max_tokens=max_tokens, temperature=float(m["temperature"]), seed=entropy_seed()
        ),
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
    cost = gaussian_cost(context.mechanism)
    tokens = int(max_tokens or context.mechanism["max_tokens"])
    charged, (part_texts, cand_texts, part_emb, cand_emb) = await paid_engine_call(
        ledger,
        context,
        cost,
        engine.name,
        _generate_and_embed(engine, embedder, context, query, tokens),
    )
    sigma = float(context.mechanism["sigma"])
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
