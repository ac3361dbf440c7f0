"""The engine in a process of its own (issue 36): placement settings (DPICL_DEVICE,
DPICL_DTYPE, DPICL_LOAD_FORMAT, the prefix cache sized to the device), the engine process's
protocol
(answers equal to the same engine in this process, errors that cross as themselves, a
dead engine that fails calls with 503 and makes /readyz say so, metrics relayed), and a
served app whose engine answers from another process.

The oracle simulator stands in for the engine where the point is the process boundary
(it starts in seconds); the bundled SmolLM2 where the point is the model's scores."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY
from pydantic import ValidationError

from dpicl.config import Settings
from dpicl.engines import factory
from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from dpicl.engines.placement import (
    CPU_PREFIX_CACHE_MIB,
    auto_prefix_cache_mib,
    resolve_device,
    resolve_dtype,
)
from dpicl.engines.process.engine import ProcessEngine
from dpicl.engines.process.wire import EngineSpec, error_of, wire_error
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import EngineError, InvalidRequest, UnsupportedParameter
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.real_model import CACHE_DIR, load_bundled

# --------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("setting", "device", "bf16", "expected"),
    [
        ("auto", "cuda", True, "bfloat16"),
        ("auto", "cuda", False, "float16"),
        ("auto", "cpu", True, "float32"),
        ("auto", "mps", True, "float32"),
        ("float16", "cpu", True, "float16"),
        ("float32", "cuda", True, "float32"),
        ("bfloat16", "cuda", False, "bfloat16"),  # asked for: the operator's choice stands
    ],
)
def test_dtype_resolution(setting: str, device: str, bf16: bool, expected: str) -> None:
    assert resolve_dtype(setting, device, bf16_supported=bf16) == expected


@pytest.mark.parametrize(("cuda", "expected"), [(True, "cuda"), (False, "cpu")])
def test_auto_device_is_the_gpu_where_torch_sees_one(
    monkeypatch: pytest.MonkeyPatch, cuda: bool, expected: str
) -> None:
    monkeypatch.delenv("DPICL_DEVICE", raising=False)
    assert Settings().device == "auto"  # the default (issue 46, item 7)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto") == expected
    # A device set stands, whatever torch sees.
    assert [resolve_device(d) for d in ("cpu", "cuda", "cuda:1")] == ["cpu", "cuda", "cuda:1"]


@pytest.mark.parametrize(("cuda", "expected"), [(True, "cuda"), (False, "cpu")])
def test_the_factory_loads_on_the_device_chosen_and_logs_the_choice(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, cuda: bool, expected: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    seen: dict[str, Any] = {}

    def load(path: Any, **kw: Any) -> SimpleNamespace:
        seen.update(kw)
        return SimpleNamespace()

    monkeypatch.setattr(TransformersEngine, "load", load)
    monkeypatch.setattr("dpicl.engines.models.resolve_llm", lambda model, cache_dir: "m")
    monkeypatch.setattr(factory, "apply_torch_threads", lambda plan: plan)
    plan = factory.torch_threads_of(1, 1)
    with caplog.at_level(logging.INFO, logger="dpicl.engines"):
        factory.build_engine("transformers", tuning=EngineTuning(), threads=plan, device="auto")
    assert seen["device"] == expected
    assert f"DPICL_DEVICE=auto: the transformers engine runs on {expected}" in caplog.text
    assert "chosen automatically" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dpicl.engines"):
        factory.build_engine("transformers", tuning=EngineTuning(), threads=plan, device="cpu")
    assert seen["device"] == "cpu" and "DPICL_DEVICE" not in caplog.text


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="'float8'"):
        resolve_dtype("float8", "cpu")
    with pytest.raises(ValidationError, match="dtype"):
        Settings(dtype="float8")  # type: ignore[arg-type]


def test_prefix_cache_is_sized_to_the_device() -> None:
    assert auto_prefix_cache_mib("cpu", None) == CPU_PREFIX_CACHE_MIB
    assert auto_prefix_cache_mib("cpu", 100 * 2**30) == CPU_PREFIX_CACHE_MIB  # host: shared
    # 40% of what the GPU has free after the weights: 125 GiB free on an H200 with an 8B model.
    assert auto_prefix_cache_mib("cuda", 125 * 2**30) == 51_200
    assert auto_prefix_cache_mib("cuda", 2**20) == CPU_PREFIX_CACHE_MIB  # never below the CPU's
    unset = EngineTuning()
    assert unset.prefix_cache_mib is None and unset.batch_wait_ms == 0.0
    assert unset.sized_for("cuda", 10 * 2**30).prefix_cache_mib == 4096
    assert EngineTuning(prefix_cache_mib=7).sized_for("cuda", 10 * 2**30).prefix_cache_mib == 7
    assert EngineTuning(prefix_cache_mib=0).sized_for("cuda", 10 * 2**30).prefix_cache_mib == 0


def test_engine_process_setting() -> None:
    assert Settings(engine="transformers").separate_engine_process()
    assert not Settings(engine="oracle").separate_engine_process()
    assert not Settings(engine="vllm").separate_engine_process()
    assert Settings(engine="oracle", engine_process="on").separate_engine_process()
    assert not Settings(engine="transformers", engine_process="off").separate_engine_process()
    with pytest.raises(ValidationError, match="vLLM runs its engine core"):
        Settings(engine="vllm", engine_process="on")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-layer Llama config and the bundled tokenizer: no weights."""
    from transformers import AutoTokenizer, LlamaConfig

    from dpicl.engines.models import resolve_llm

    out = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(str(resolve_llm(None, CACHE_DIR)))
    tok.save_pretrained(str(out))
    LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tok),
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    ).save_pretrained(str(out))
    return out


def test_dummy_load_format_builds_random_weights_in_the_asked_dtype(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auto = TransformersEngine.load(tiny_model_dir, load_format="dummy")
    assert (auto.dtype, auto.load_format) == ("float32", "dummy")  # auto on the CPU
    assert "RANDOM weights" in caplog.text
    half = TransformersEngine.load(tiny_model_dir, load_format="dummy", dtype="bfloat16")
    assert half.dtype == "bfloat16"
    assert {p.dtype for p in half.model_obj.parameters()} == {torch.bfloat16}
    # Random, not loaded: two builds differ.
    a = next(auto.model_obj.parameters())
    assert not torch.equal(a, next(half.model_obj.parameters()).float())
    scores = asyncio.run(auto.score_labels([PromptSpec(text="Is it?", query="q")], ["Yes", "No"]))
    assert scores.shape == (1, 2) and np.isfinite(scores).all()
    with pytest.raises(EngineError, match="'float8'"):
        TransformersEngine.load(tiny_model_dir, load_format="dummy", dtype="float8")
    with pytest.raises(EngineError, match="'pt'"):
        TransformersEngine.load(tiny_model_dir, load_format="pt")
    # No weights in the directory: only dummy can build it.
    with pytest.raises(EngineError, match="cannot load the model"):
        TransformersEngine.load(tiny_model_dir)


# --------------------------------------------------------------------- the protocol


def test_errors_cross_the_boundary_as_themselves() -> None:
    err = error_of(wire_error(UnsupportedParameter("no logprobs", param="logprobs")))
    assert type(err) is UnsupportedParameter
    assert (err.message, err.param, err.status_code) == ("no logprobs", "logprobs", 400)
    other = error_of(wire_error(RuntimeError("CUDA error: misaligned address")))
    assert type(other) is EngineError
    assert "RuntimeError: CUDA error: misaligned address" in other.message


@pytest.fixture(scope="module")
def oracle_process() -> Iterator[ProcessEngine]:
    engine = ProcessEngine.start(EngineSpec(name="oracle"))
    yield engine
    asyncio.run(engine.aclose())


PROMPTS = [
    PromptSpec(text="Review: a fine film\nSentiment:", query="a fine film"),
    PromptSpec(text="Review: awful\nSentiment:", query="awful"),
    PromptSpec(text="Q: capital of France?\nA:", query="capital of France?"),
]


async def test_an_engine_process_answers_as_the_engine_would_here(
    oracle_process: ProcessEngine,
) -> None:
    here = OracleEngine()
    assert oracle_process.engine_pid != os.getpid() and oracle_process.is_ready()
    assert (oracle_process.name, oracle_process.is_simulator) == ("oracle", True)
    labels = ["positive", "negative"]
    np.testing.assert_array_equal(
        await oracle_process.score_labels(PROMPTS, labels), await here.score_labels(PROMPTS, labels)
    )
    params = GenerationParams(max_tokens=4, temperature=0.0)
    assert await oracle_process.generate(PROMPTS, params) == await here.generate(PROMPTS, params)
    # A DPS-MOZO session: steps, advances and the decoded suffix, there as here.
    theirs = await oracle_process.open_decoding(PROMPTS, zero_shot_index=2, top_k=5)
    ours = await here.open_decoding(PROMPTS, zero_shot_index=2, top_k=5)
    assert theirs.eos_token_id == ours.eos_token_id
    ids: list[int] = []
    for _ in range(3):
        a, b = await theirs.step(), await ours.step()
        np.testing.assert_array_equal(a.top_ids, b.top_ids)
        np.testing.assert_array_equal(a.logits, b.logits)
        ids.append(int(a.top_ids[0]))
        await theirs.advance(ids[-1])
        await ours.advance(ids[-1])
        assert theirs.decode(ids) == ours.decode(ids)
    await theirs.aclose()
    await ours.aclose()
    # Concurrent calls each get their own answer.
    many = await asyncio.gather(*(oracle_process.score_labels([p], labels) for p in PROMPTS * 10))
    for p, got in zip(PROMPTS * 10, many, strict=True):
        np.testing.assert_array_equal(got, await here.score_labels([p], labels))


async def test_an_engine_error_is_the_same_error_here(oracle_process: ProcessEngine) -> None:
    with pytest.raises(InvalidRequest) as info:
        await oracle_process.score_labels(PROMPTS, [])
    assert info.value.param == "labels" and "at least one label" in info.value.message
    with pytest.raises(InvalidRequest, match="max_tokens"):  # refused here, no round trip
        await oracle_process.generate(PROMPTS, GenerationParams(max_tokens=0))
    # The process serves on after an error.
    assert (await oracle_process.score_labels(PROMPTS[:1], ["a", "b"])).shape == (1, 2)


async def test_a_dead_engine_process_fails_every_call_with_503() -> None:
    engine = await asyncio.to_thread(ProcessEngine.start, EngineSpec(name="oracle"))
    try:
        os.kill(engine.engine_pid, signal.SIGKILL)
        with pytest.raises(EngineError, match="exited with code -9") as info:
            await asyncio.wait_for(engine.score_labels(PROMPTS, ["a", "b"]), 30)
        assert info.value.status_code == 503
        assert not engine.is_ready()
        with pytest.raises(EngineError, match="exited"):
            await engine.generate(PROMPTS, GenerationParams())
    finally:
        await engine.aclose()


def test_an_engine_that_cannot_be_built_fails_the_start_with_its_reason(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    missing.mkdir()
    with pytest.raises(EngineError, match="cannot load the model") as info:
        ProcessEngine.start(EngineSpec(name="transformers", model=str(missing)))
    assert str(missing) in info.value.message


def test_closing_ends_the_engine_process() -> None:
    engine = ProcessEngine.start(EngineSpec(name="oracle"))
    pid = engine.engine_pid
    asyncio.run(engine.aclose())
    assert not engine.is_ready()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone and reaped
    with pytest.raises(EngineError, match="closed"):
        asyncio.run(engine.score_labels(PROMPTS, ["a", "b"]))


# --------------------------------------------------------------------- served


def test_a_served_app_answers_from_its_engine_process_and_refunds_when_it_dies(
    tmp_path: Path,
) -> None:
    with make_client(tmp_path, engine_process="on", device="auto") as c:
        ready = c.get("/readyz").json()
        assert ready["engine_pid"] not in (None, ready["pid"])
        # The oracle runs on the CPU, and /readyz says the device was chosen, not set.
        assert (ready["device"], ready["device_setting"]) == ("cpu", "auto")
        body = voting_context(budget={"epsilon": 10.0, "delta": 1e-4})
        cid = c.post("/v1/contexts", json=body, headers=admin_headers())
        assert cid.status_code == 201, cid.text
        cid_ = cid.json()["id"]
        model = c.get(f"/v1/models/{cid_}", headers=user_headers()).json()["dpicl"]
        assert (model["engine"], model["dtype"]) == ("oracle", None)  # a simulator: no weights
        ask = {"context_id": cid_, "query": "Private record number 3: customer paid"}
        r = c.post("/v1/classify", json=ask, headers=user_headers())
        assert r.status_code == 200, r.text
        spent = r.json()["budget"]
        os.kill(ready["engine_pid"], signal.SIGKILL)
        r = c.post("/v1/classify", json=ask, headers=user_headers())
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        r = c.get("/readyz")
        assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
        # Nothing was charged for the answer that never came.
        got = c.get(f"/v1/contexts/{cid_}", headers=admin_headers())
        assert got.json()["spent"]["queries"] == spent["queries"] == 1


# --------------------------------------------------------------------- the real model


@pytest.mark.slow
async def test_the_bundled_model_scores_alike_in_its_process_and_here() -> None:
    here = load_bundled("cpu")
    there = await asyncio.to_thread(
        ProcessEngine.start, EngineSpec(name="transformers", cache_dir=CACHE_DIR)
    )
    try:
        assert there.dtype == "float32" and there.load_format == "auto"
        prompts = [
            PromptSpec(
                text=f"Review: {t}\nSentiment:",
                query=t,
                prefix_chars=len("Review: "),
                cache_key="ctx/0",
                cache_scope="ctx",
            )
            for t in ("a fine film", "awful", "moving and funny", "dull")
        ]
        labels = ["positive", "negative"]
        hits = REGISTRY.get_sample_value("dpicl_prefix_cache_hits_total") or 0.0
        for _ in range(2):  # the second time from the engine process's prefix cache
            np.testing.assert_allclose(
                await there.score_labels(prompts, labels),
                await here.score_labels(prompts, labels),
                atol=1e-4,
            )
        # The prompts crossed as token ids, tokenised here, the later ones by their suffix only
        # (issue 46: nothing is tokenised on the engine process's thread).
        assert there.tokens is not None and there.tokens.suffixes >= 6
        # What the engine process observed reached this process's metrics.
        assert (REGISTRY.get_sample_value("dpicl_prefix_cache_hits_total") or 0.0) > hits
        assert (
            REGISTRY.get_sample_value("dpicl_engine_batch_size_count", {"batcher": "score"}) or 0.0
        ) > 0
        session = await there.open_decoding(prompts[:3], zero_shot_index=2, top_k=8)
        step = await session.step()
        assert step.logits.shape == (3, 8)
        await session.advance(int(step.top_ids[0]))
        assert isinstance(session.decode([int(step.top_ids[0])]), str)
        await session.aclose()
    finally:
        await there.aclose()
        await here.aclose()


def test_vllm_takes_the_dtype_and_load_format_settings() -> None:
    from dpicl.engines.vllm.options import VllmOptions

    auto = VllmOptions.from_settings(Settings(engine="vllm"))
    assert (auto.dtype, auto.load_format) == (None, "auto")  # vLLM's own choice
    chosen = VllmOptions.from_settings(
        Settings(engine="vllm", dtype="float16", load_format="dummy")
    )
    assert (chosen.dtype, chosen.load_format) == ("float16", "dummy")
