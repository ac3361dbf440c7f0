"""DPS-MOZO decoding sessions of the transformers engine (paper 004, Algorithm 1).

A session encodes its prompts once, keeps their KV cache, and advances all rows with one
single-token forward per generated token; ``recompute=True`` opens a reference session that
re-runs the full prompts plus the suffix at every step (no cache); the benchmark
(``bench/mozo.py``) and the tests compare the two. Sessions never use the per-context prefix
cache. Every model call runs through the engine's lock (:meth:`TransformersEngine._run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpicl.engines.base import PromptSpec, StepLogits
from dpicl.engines.transformers_past import prefill
from dpicl.errors import EngineError, InvalidRequest

if TYPE_CHECKING:
    from dpicl.engines.transformers import TransformersEngine

__all__ = ["TransformersDecodingSession"]


class TransformersDecodingSession:
    """A DPS-MOZO session over one :class:`TransformersEngine` (see the module docstring)."""

    def __init__(
        self,
        engine: TransformersEngine,
        prompts: list[PromptSpec],
        *,
        zero_shot_index: int,
        top_k: int,
        recompute: bool = False,
    ) -> None:
        self._engine = engine
        self._prompts = prompts
        self.zero_shot_index = zero_shot_index
        self.top_k = top_k
        self.recompute = recompute
        self.eos_token_id: int = engine.eos_token_id
        self.suffix: list[int] = []
        self._prompt_ids: list[list[int]] = []
        self._cache: Any = None
        self._attn: torch.Tensor | None = None
        self._pos: torch.Tensor | None = None
        self._last: torch.Tensor | None = None  # (n_prompts, V) logits of the next token
        self._closed = False

    @property
    def n_prompts(self) -> int:
        return len(self._prompts)

    def _start_sync(self) -> None:
        eng = self._engine
        self._prompt_ids = [eng.encode(p)[1] for p in self._prompts]
        if self.recompute:
            self._last = self._recompute_last()
            return
        # One session is one call (and one context): its rows may share their prefix.
        scopes = [p.cache_scope for p in self._prompts]
        pre = prefill(eng, self._prompt_ids, scopes=scopes, use_cache=True)
        self._cache = pre.res.past_key_values
        self._attn = pre.attention_mask
        self._pos = pre.last_pos
        self._last = pre.res.logits[:, -1, :].float()

    def _recompute_last(self) -> torch.Tensor:
        eng = self._engine
        batch = eng._left_pad([ids + self.suffix for ids in self._prompt_ids])
        res = eng._forward(
            batch.input_ids, batch.attention_mask, batch.position_ids, last_only=True
        )
        return res.logits[:, -1, :].float()  # type: ignore[no-any-return]

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the decoding session is closed")

    async def step(self) -> StepLogits:
        self._check_open()
        return await self._engine._run(self._step_sync)

    def _step_sync(self) -> StepLogits:
        last = self._last
        if last is None:  # pragma: no cover - open_decoding always starts the session
            raise EngineError("the decoding session was not started")
        top = torch.topk(last[self.zero_shot_index], self.top_k).indices
        logits = last.index_select(1, top).double().cpu().numpy()
        return StepLogits(top_ids=top.cpu().numpy().astype(np.int64), logits=logits)

    async def advance(self, token_id: int) -> None:
        self._check_open()
        tok = int(token_id)
        if not 0 <= tok < self._engine.vocab_size:
            raise InvalidRequest(f"token id {tok} is outside the vocabulary")
        await self._engine._run(self._advance_sync, tok)

    def _advance_sync(self, tok: int) -> None:
        eng = self._engine
        self.suffix.append(tok)
        if self.recompute:
            self._last = self._recompute_last()
            return
        assert self._attn is not None and self._pos is not None
        n = self.n_prompts
        inp = torch.full((n, 1), tok, dtype=torch.long, device=eng.device)
        self._attn = torch.cat(
            [self._attn, torch.ones((n, 1), dtype=self._attn.dtype, device=eng.device)], 1
        )
        self._pos = self._pos + 1
        res = eng._forward(inp, self._attn, self._pos[:, None], past=self._cache, use_cache=True)
        self._cache = res.past_key_values
        self._last = res.logits[:, -1, :].float()

    def decode(self, token_ids: Sequence[int]) -> str:
        text = self._engine.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return str(text)

    async def aclose(self) -> None:
        self._closed = True
        self._cache = None
        self._last = None
        self._attn = None
        self._pos = None
