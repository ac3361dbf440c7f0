"""The transformers engine never shares a computed prefix between contexts in one batch.

The micro-batchers merge the calls of concurrent requests, so one forward may hold the
prompts of several contexts. Before the fix, :func:`dpicl.engines.transformers.past.
shared_past` encoded the common token prefix of *all* the rows of such a batch once and
copied it to every row (when their prefixes were first cached, and whenever no row had a
cached prefix). How far one context's exemplars agree with another's then set how much work
a co-batched request saved, a timing side channel between contexts, and one context's KV
state was computed with, and cached from, another's: exactly the cross-context sharing that
DESIGN.md section 3 forbids for the prefix cache.

A tiny randomly initialised Llama and a one-token-per-character tokenizer make this a fast
test of the real engine code; :func:`shared_past` is observed, not replaced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.transformers import past as transformers_past
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.engines.transformers.generation import generate_jobs
from dpicl.engines.transformers.scoring import score_jobs
from dpicl.engines.tuning import EngineTuning
from dpicl.pipelines.partitions import partition_prompts
from dpicl.serving.contexts import create_context
from dpicl.spec import ContextSpec
from dpicl.store.repository import ContextRepository, StoredContext
from tests.server.api_helpers import AUDIT_TEMPLATE, CharTokenizer


def tiny_engine(**tuning: Any) -> TransformersEngine:
    torch.manual_seed(0)  # the model's weights (test fixture), not DP noise
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(config).eval()
    return TransformersEngine(
        model,
        CharTokenizer(),
        model_name="tiny",
        use_chat_template=False,
        tuning=EngineTuning(**tuning),
    )


async def _context(repo: ContextRepository, tag: str) -> StoredContext:
    spec = ContextSpec.model_validate(
        {
            "task": "classification",
            "labels": ["Yes", "No"],
            "exemplars": [
                {"input": f"Record {tag}{i}: customer paid invoice {i}", "output": "Yes"}
                for i in range(4)
            ],
            "template": AUDIT_TEMPLATE,
            "mechanism": {"name": "voting", "epsilon": 1.0, "partitions": 2, "partition_seed": 1},
        }
    )
    return await create_context(spec, repo)


def _contexts(tmp_path: Path) -> tuple[StoredContext, StoredContext]:
    async def make() -> tuple[StoredContext, StoredContext]:
        repo = ContextRepository(f"sqlite:///{tmp_path / 'ctx.db'}")
        repo.create_schema()
        try:
            return await _context(repo, "A"), await _context(repo, "B")
        finally:
            repo.dispose()

    return asyncio.run(make())


@pytest.mark.parametrize("prefix_cache_mib", [64, 0])
@pytest.mark.parametrize("call", ["score", "generate"])
def test_contexts_in_one_batch_share_no_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix_cache_mib: int, call: str
) -> None:
    engine = tiny_engine(prefix_cache_mib=prefix_cache_mib)
    a, b = _contexts(tmp_path)
    query = "Is record A1 here?"
    prompts: dict[str, list[PromptSpec]] = {
        a.id: partition_prompts(a, query),
        b.id: partition_prompts(b, query),
    }
    full = {cid: [engine.encode(p)[1] for p in ps] for cid, ps in prompts.items()}

    def owner(seq: Sequence[int]) -> str:
        """The context whose prompts ``seq`` starts (the prefixes differ by context)."""
        found = {
            cid for cid, seqs in full.items() for ids in seqs if list(ids[: len(seq)]) == list(seq)
        }
        assert len(found) == 1, found
        return found.pop()

    shared: list[set[str]] = []
    original = transformers_past.shared_past

    def spy(engine_: Any, seqs: Sequence[Sequence[int]], *rest: Any) -> Any:
        past = original(engine_, seqs, *rest)
        if past.cache is not None:  # a prefix was encoded once for all these rows
            shared.append({owner(s) for s in seqs})
        return past

    monkeypatch.setattr(transformers_past, "shared_past", spy)

    def run(jobs_prompts: list[list[PromptSpec]]) -> None:
        # Encoded as the engine's callers encode them (one call marker each), then merged.
        if call == "score":
            jobs = [
                engine.tokens.encode_scoring(p, ["Yes", "No"], f"call:{j}")
                for j, p in enumerate(jobs_prompts)
            ]
            results: list[Any] = engine.locked(score_jobs, engine, jobs)
        else:
            params = GenerationParams(max_tokens=2, temperature=0.0, seed=1)
            gen_jobs = [
                (engine.tokens.encode_generation(p, f"call:{j}"), params)
                for j, p in enumerate(jobs_prompts)
            ]
            results = engine.locked(generate_jobs, engine, gen_jobs)
        assert not any(isinstance(r, BaseException) for r in results), results

    # Two contexts' calls merged into one batch: no prefix is shared across them.
    run([prompts[a.id], prompts[b.id]])
    assert all(len(owners) == 1 for owners in shared), shared
    # One context's prompts alone still share their common prefix.
    engine.prefix_cache.clear()
    shared.clear()
    run([prompts[a.id]])
    assert shared == [{a.id}]


# --------------------------------------------------------------------------- DPS-MOZO


MOZO_TEMPLATE = "Follow the examples.\n\n{exemplars}\n\nInput: {query}\nOutput:"


def _mozo_prompts(exemplar_inputs: Sequence[str]) -> list[PromptSpec]:
    from dpicl.engines.base import Exemplar
    from dpicl.prompts import render

    def one(exemplars: list[Exemplar]) -> PromptSpec:
        return render(MOZO_TEMPLATE, exemplars, "what is up", task="generation", cache_scope="c")

    return [*(one([Exemplar(x, "fine")]) for x in exemplar_inputs), one([])]


def test_the_zero_shot_row_is_a_function_of_the_public_prompt_alone() -> None:
    """DPS-MOZO's proof (docs/privacy.md, proven mode) takes the support S, the zero-shot
    top-k, and p0 from the zero-shot prompt alone, so they are equal under neighbours.
    Encoded in one left-padded batch with the one-shot rows, the zero-shot row's logits
    moved with the longest private exemplar (by ~6e-8 here): a near-tie at the k-th logit
    could then flip S, and a token in one neighbour's support has probability 0 under the
    other's, which no eps bounds. Bitwise equality, step after step, is the invariant."""
    engine = tiny_engine()
    runs = []
    for inputs in (["short a", "c"], ["a much longer private exemplar " * 20, "c"], []):
        prompts = _mozo_prompts(inputs)

        async def decode(prompts: list[PromptSpec] = prompts) -> list[Any]:
            s = await engine.open_decoding(prompts, zero_shot_index=len(prompts) - 1, top_k=50)
            rows = []
            for tok in (65, 66, 67):
                step = await s.step()
                rows.append((step.top_ids, step.logits[-1]))
                await s.advance(tok)
            await s.aclose()
            return rows

        runs.append(asyncio.run(decode()))
    reference = runs[-1]  # the zero-shot prompt alone
    for run in runs[:-1]:
        for (ids, zero), (ref_ids, ref_zero) in zip(run, reference, strict=True):
            assert (ids == ref_ids).all()
            assert (zero == ref_zero).all(), float(abs(zero - ref_zero).max())
