"""Every prompt the pipelines hand an engine carries its context's id as ``cache_scope``
(the vLLM engine salts its prefix cache with it), whatever the client sends."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.test_api_mozo import mozo_context


class RecordingOracle(OracleEngine):
    """The oracle simulator, remembering the scopes of the prompts it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[str] = []

    async def score_labels(self, prompts: Sequence[PromptSpec], labels: Sequence[str]) -> Any:
        self.scopes += [p.cache_scope for p in prompts]
        return await super().score_labels(prompts, labels)

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> Any:
        self.scopes += [p.cache_scope for p in prompts]
        return await super().generate(prompts, params)

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> Any:
        self.scopes += [p.cache_scope for p in prompts]
        return await super().open_decoding(prompts, zero_shot_index=zero_shot_index, top_k=top_k)


def test_pipelines_scope_prompts_by_context(tmp_path: Path) -> None:
    engine = RecordingOracle()
    with make_client(tmp_path, engine=engine) as client:
        ids = []
        for body, route in ((voting_context(), "classify"), (mozo_context(), "generate")):
            r = client.post("/v1/contexts", json=body, headers=admin_headers())
            assert r.status_code == 201, r.text
            cid = r.json()["id"]
            ids.append(cid)
            engine.scopes.clear()
            # A client-sent cache_scope/cache_salt is not part of the request schema's
            # meaning: it is rejected or ignored, never used.
            r = client.post(
                f"/v1/{route}",
                json={"context_id": cid, "query": "Is this in there?", "cache_salt": "x"},
                headers=user_headers(),
            )
            assert r.status_code in (200, 422), r.text
            if r.status_code == 422:
                r = client.post(
                    f"/v1/{route}",
                    json={"context_id": cid, "query": "Is this in there?"},
                    headers=user_headers(),
                )
                assert r.status_code == 200, r.text
            assert engine.scopes and set(engine.scopes) == {cid}
        assert ids[0] != ids[1]


def test_vllm_options_from_settings() -> None:
    import pytest

    from dpicl.config import Settings
    from dpicl.engines.vllm.options import VllmOptions, cache_salt
    from dpicl.errors import EngineError

    opts = VllmOptions.from_settings(
        Settings(cache_salt_secret="s" * 32, vllm_block_size=16, vllm_kv_cache_gib=0.5)
    )
    assert (opts.salt_secret, opts.block_size, opts.kv_cache_gib) == (b"s" * 32, 16, 0.5)
    assert "salt_secret" not in repr(opts)
    # Unset: a random secret per process, so salts cannot be predicted from context ids.
    a, b = VllmOptions.from_settings(Settings()), VllmOptions.from_settings(Settings())
    assert len(a.salt_secret) == 32 and a.salt_secret != b.salt_secret
    assert cache_salt(a.salt_secret, "ctx_1") != cache_salt(b.salt_secret, "ctx_1")
    with pytest.raises(EngineError, match="16 bytes"):
        VllmOptions.from_settings(Settings(cache_salt_secret="short"))


def test_vllm_parallelism_settings_reach_the_engine_args() -> None:
    from dpicl.config import Settings
    from dpicl.engines.vllm.options import VllmOptions, engine_args

    opts = VllmOptions.from_settings(
        Settings(vllm_tensor_parallel_size=4, vllm_data_parallel_size=2)
    )
    args = engine_args(opts, "/models/llm", "llm", on_cpu=False)
    assert (args["tensor_parallel_size"], args["data_parallel_size"]) == (4, 2)
    default = engine_args(VllmOptions.from_settings(Settings()), "m", "m", on_cpu=True)
    assert (default["tensor_parallel_size"], default["data_parallel_size"]) == (1, 1)
    # The DP settings of the engine are untouched by the refactor into engine_args.
    assert default["logprobs_mode"] == "raw_logprobs" and default["enable_log_requests"] is False
