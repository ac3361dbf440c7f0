"""An engine's failure reaches the client (any API key holder) by its type only: the text of
an exception may quote the prompt, which holds private exemplars."""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dpicl.engines.vllm import VllmEngine
from dpicl.errors import EngineError

SECRET = "SECRET-EXEMPLAR-91c2"


class _FailingLLM:
    async def generate(self, *_: Any) -> AsyncIterator[Any]:
        raise RuntimeError(f"detokenizer choked on 'Input: {SECRET}'")
        yield  # an async generator, like AsyncLLM.generate


async def test_a_vllm_failure_is_reported_by_type_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # vllm itself is not installed here: stub the one import request() makes.
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    engine = VllmEngine.__new__(VllmEngine)
    engine.llm = _FailingLLM()
    engine._closed = False
    with pytest.raises(EngineError) as info:
        await engine.request([1, 2, 3], "salt", None)
    assert "RuntimeError" in info.value.message
    assert SECRET not in info.value.message
    assert SECRET not in caplog.text
