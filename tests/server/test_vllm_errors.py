"""The vLLM engine's errors carry the exception's type, never its text.

vLLM's messages quote the request ("The decoder prompt (length 1234) is longer than ...",
or the prompt itself), and the prompts of a voting, ESA or DPS-MOZO call hold private
exemplars. ``paid_engine_call`` passes a :class:`~dpicl.errors.DpiclError` on to the client
verbatim and refunds the call, so before the fix the client read a function of the
exemplars, un-noised and for free. vLLM itself is not needed: a stub ``vllm.inputs`` and a
stub ``AsyncLLM`` that fails with such a message stand in for it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dpicl.engines.vllm.engine import VllmEngine
from dpicl.engines.vllm.options import VllmOptions
from dpicl.errors import DpiclError, EngineError, InvalidRequest

SECRET = "Private record 7: customer paid invoice 1007"


class FailingLLM:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        raise self.exc
        yield  # pragma: no cover - an async generator


class NoTokenizer:
    chat_template = None
    bos_token_id = eos_token_id = pad_token_id = 0


@pytest.fixture
def stub_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    vllm = types.ModuleType("vllm")
    vllm.inputs = inputs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ValueError(f"The decoder prompt (length 1234) is longer: {SECRET}"), InvalidRequest),
        (RuntimeError(f"engine core died on request {SECRET}"), EngineError),
    ],
)
async def test_vllm_errors_do_not_quote_the_request(
    stub_vllm: None, exc: Exception, kind: type[DpiclError], caplog: pytest.LogCaptureFixture
) -> None:
    engine = VllmEngine(
        FailingLLM(exc),
        NoTokenizer(),
        model_name="stub",
        options=VllmOptions(),
        vocab_size=10,
        max_model_len=4096,
        eos_token_id=0,
    )
    with pytest.raises(kind) as info:
        await engine.request([1, 2, 3], "salt", params=None)
    assert "1234" not in info.value.message
    assert SECRET not in info.value.message
    assert type(exc).__name__ in info.value.message
    assert info.value.__cause__ is None  # nor chained, for any handler that renders it
    assert SECRET not in caplog.text  # nor in the server's log
