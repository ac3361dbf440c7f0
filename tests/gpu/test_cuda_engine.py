"""The transformers engine on a CUDA device against the same model on the CPU.

Deselected by default (marker ``gpu``); on a machine with a GPU:

    pytest -m gpu tests/gpu

The rest of the real-model assertions run on the GPU through
``DPICL_TEST_DEVICE=cuda pytest -m slow tests/server/test_transformers_engine.py
tests/server/test_prefix_reuse.py`` (``tests/server/real_model.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.engines.tuning import EngineTuning
from dpicl.pipelines.partitions import partition_prompts
from dpicl.serving.contexts import create_context
from dpicl.spec import ContextSpec
from dpicl.store.repository import ContextRepository, StoredContext
from tests.conftest import admin_headers, user_headers
from tests.server.real_model import load_bundled
from tests.server.reference_scores import whole_prompt_scores

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
]

LABELS = ["World", "Sports", "Business", "Sci/Tech"]
NEWS = [
    ("The central bank raised interest rates again", "Business"),
    ("The striker scored twice in the derby", "Sports"),
    ("A faster quantum processor was unveiled", "Sci/Tech"),
    ("Leaders met in Geneva about the ceasefire", "World"),
    ("Oil prices climbed after the supply cut", "Business"),
    ("The home side won the cup final on penalties", "Sports"),
    ("Astronomers found water vapour on a distant planet", "Sci/Tech"),
    ("The summit ended without a joint statement", "World"),
]
QUERIES = ["Shares fell sharply after the earnings report", "x", "The keeper saved a penalty"]
ASK = "Write one sentence about the sea."
DECODE = [
    PromptSpec(text=ASK, query=ASK),
    PromptSpec(text=f"Example: The sea is calm today.\n{ASK}", query=ASK),
]
# float32 on both devices; the GPU sums in another order (and its attention kernels differ).
TOL = 2e-3


@pytest.fixture(scope="module")
def gpu() -> Iterator[TransformersEngine]:
    eng = load_bundled("cuda")
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture(scope="module")
def cpu() -> Iterator[TransformersEngine]:
    eng = load_bundled("cpu")
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture
async def context(tmp_path: Path) -> AsyncIterator[StoredContext]:
    repo = ContextRepository(f"sqlite:///{tmp_path / 'ctx.db'}")
    repo.create_schema()
    spec: dict[str, Any] = {
        "task": "classification",
        "labels": LABELS,
        "exemplars": [{"input": t, "output": lab} for t, lab in NEWS],
        "mechanism": {"name": "voting", "epsilon": 1.0, "partitions": 4, "partition_seed": 3},
    }
    yield await create_context(ContextSpec.model_validate(spec), repo)
    repo.dispose()


def test_the_engine_runs_where_the_weights_are(gpu: TransformersEngine) -> None:
    weights = next(gpu.model_obj.parameters()).device
    assert gpu.device.type == weights.type == "cuda"
    # A second engine over the loaded model (another tuning) follows the weights.
    sibling = TransformersEngine(gpu.model_obj, gpu.tokenizer, model_name="s")
    assert sibling.device == weights


async def test_cold_and_warm_scores_on_the_gpu_equal_the_cpu_engine(
    gpu: TransformersEngine, cpu: TransformersEngine, context: StoredContext
) -> None:
    for n, query in enumerate(QUERIES):
        prompts = partition_prompts(context, query)
        got = await gpu.score_labels(prompts, LABELS)  # cold for the first query
        ref = await cpu.score_labels(prompts, LABELS)
        np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)
        assert gpu.prefix_cache.stats.hits == n * len(prompts)
    # And against the reference that shares no code path with the engine's scoring.
    prompts = partition_prompts(context, QUERIES[0])
    np.testing.assert_allclose(
        await gpu.score_labels(prompts, LABELS),
        whole_prompt_scores(cpu, prompts, LABELS),
        atol=TOL,
    )


async def test_concurrent_calls_on_the_gpu_get_the_scores_of_serial_ones(
    gpu: TransformersEngine, context: StoredContext
) -> None:
    eng = TransformersEngine(
        gpu.model_obj, gpu.tokenizer, model_name="b", tuning=EngineTuning(batch_wait_ms=20)
    )
    batches = [partition_prompts(context, q) for q in QUERIES * 3]
    serial = [await eng.score_labels(p, LABELS) for p in batches]
    together = await asyncio.gather(*(eng.score_labels(p, LABELS) for p in batches))
    for a, b in zip(serial, together, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


async def test_sampled_generation_on_the_gpu_follows_its_seed(
    gpu: TransformersEngine, context: StoredContext
) -> None:
    prompts = partition_prompts(context, QUERIES[0])
    hot = GenerationParams(max_tokens=12, temperature=1.0, seed=99)
    first = await gpu.generate(prompts, hot)
    assert len(first) == len(prompts) and all(isinstance(t, str) for t in first)
    assert await gpu.generate(prompts, hot) == first
    greedy = GenerationParams(max_tokens=12, temperature=0.0)
    assert await gpu.generate(prompts, greedy) == await gpu.generate(prompts, greedy)


async def test_decoding_on_the_gpu_equals_recompute(gpu: TransformersEngine) -> None:
    kv = await gpu.open_decoding(DECODE, zero_shot_index=0, top_k=10)
    ref = await gpu.open_decoding(DECODE, zero_shot_index=0, top_k=10, recompute=True)
    for _ in range(4):
        a, b = await kv.step(), await ref.step()
        np.testing.assert_array_equal(a.top_ids[:3], b.top_ids[:3])
        np.testing.assert_allclose(a.logits[:, :3], b.logits[:, :3], atol=1e-3)
        await kv.advance(int(a.top_ids[0]))
        await ref.advance(int(a.top_ids[0]))
    await kv.aclose()
    await ref.aclose()


def test_a_server_on_the_gpu_classifies_over_http(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "transformers",
            "DPICL_DEVICE": "cuda",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/gpu.db",
        }
    )
    body = {
        "task": "classification",
        "labels": LABELS,
        "exemplars": [{"input": t, "output": lab} for t, lab in NEWS],
        "mechanism": {"name": "voting", "epsilon": 4.0, "delta": 1e-5, "partitions": 4},
        "budget": {"epsilon": 40.0, "delta": 1e-4},
    }
    # The served defaults on a GPU (issue 36): bfloat16 where the device has it, the model
    # in an engine process of its own, the prefix cache sized to the device.
    ready = httpx.get(f"{srv.url}/readyz").json()
    bf16 = torch.cuda.is_bf16_supported()
    assert ready["dtype"] == ("bfloat16" if bf16 else "float16")
    assert ready["engine_pid"] not in (None, ready["pid"])
    assert ready["prefix_cache_mib"] > 256
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    for query in QUERIES:
        r = httpx.post(
            f"{srv.url}/v1/classify",
            json={"context_id": cid, "query": query},
            headers=user_headers(),
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["label"] in LABELS
    spent = httpx.get(f"{srv.url}/v1/contexts/{cid}", headers=admin_headers()).json()["spent"]
    assert spent["queries"] == len(QUERIES)
