"""Test engine (not a fault): the oracle whose DPS-MOZO decoding steps take ``DELAY`` seconds
and never choose end-of-sequence, so that an answer streams for ``max_tokens`` tokens at a
pace a test can interrupt. Each step appends a line to the file named by
``DPICL_TEST_STEP_LOG``, so the test sees from outside whether sampling went on after its
client disconnected.

    start_server(env | {"DPICL_TEST_STEP_LOG": path}, fault="tests.e2e.slow_decoding_server")
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpicl.engines.base import PromptSpec, StepLogits
from dpicl.engines.oracle.engine import OracleEngine

DELAY = 0.1
WARNING = f"TEST ENGINE: oracle decoding slowed to {DELAY} s a token, end-of-sequence never chosen"
"""What the server logs at start (:func:`tests.servers.serve_with_fault`)."""

_honest_open = OracleEngine.open_decoding


class SlowSession:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.eos_token_id = inner.eos_token_id
        self.log = os.environ["DPICL_TEST_STEP_LOG"]

    async def step(self) -> StepLogits:
        await asyncio.sleep(DELAY)
        with open(self.log, "a") as f:  # noqa: ASYNC230 (a test engine; one short line)
            f.write("step\n")
        out: StepLogits = await self.inner.step()
        logits = out.logits.copy()
        logits[:, out.top_ids == self.eos_token_id] = -1e4  # every row agrees: never EOS
        return StepLogits(top_ids=out.top_ids, logits=logits.astype(np.float64))

    async def advance(self, token_id: int) -> None:
        await self.inner.advance(token_id)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.inner.decode(token_ids))

    async def aclose(self) -> None:
        await self.inner.aclose()


async def slow_open(
    self: OracleEngine, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
) -> SlowSession:
    return SlowSession(
        await _honest_open(self, prompts, zero_shot_index=zero_shot_index, top_k=top_k)
    )


def install() -> None:
    OracleEngine.open_decoding = slow_open  # type: ignore[method-assign,assignment]
