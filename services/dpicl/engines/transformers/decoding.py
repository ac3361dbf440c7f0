"""DPS-MOZO decoding sessions of the transformers engine (paper 004, Algorithm 1).

A session encodes its prompts once, keeps their KV cache, and advances all rows with one
single-token forward per generated token; ``recompute=True`` opens a reference session that
re-runs the full prompts plus the suffix at every step (no cache); the benchmark
(``bench/mozo.py``) and the tests compare the two. Sessions never use the per-context prefix
cache; their KV lives in slots of their own (:func:`~.slot_cache.own_slots`).
Every model call runs through the engine's lock (:meth:`~.runner.ModelRunner.run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpicl.engines.base import PromptSpec, StepLogits
from dpicl.engines.transformers.past import prefill
from dpicl.engines.transformers.runner import ModelRunner
from dpicl.engines.transformers.slot_cache import own_slots
from dpicl.errors import EngineError, InvalidRequest

__all__ = ["SESSION_ROOM", "TransformersDecodingSession"]

#: Positions a session's slots hold for generated tokens before they first double.
SESSION_ROOM = 64


@dataclass(slots=True)
class _Rows:
    """Rows of a session that run together: their positions in the session's prompt order,
    token ids and KV state."""

    at: list[int]
    ids: list[list[int]]
    cache: Any = None
    attn: torch.Tensor | None = None
    pos: torch.Tensor | None = None
    last: torch.Tensor | None = None  # (len(at), V) logits of the next token


class TransformersDecodingSession:
    """A DPS-MOZO session over the transformers engine's model runner (see the module
    docstring).

    The zero-shot row runs on its own (its own forward, no padding, no shared prefix),
    apart from the one-shot rows. Paper 004's Algorithm 1 takes the support (the zero-shot
    top-k) and p0 from the public zero-shot prompt, and the proven mode's proof
    (docs/privacy.md) needs them equal under neighbouring contexts. Batched with the
    one-shot rows, the zero-shot row's logits moved in their last bits with the longest
    private prompt (the padding) and the shared prefix; a near-tie at the k-th logit could
    then change the support, and a token in one neighbour's support has probability 0
    under the other's. The price is one batch-of-one forward per token.
    """

    def __init__(
        self,
        engine: ModelRunner,
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
        self._groups: list[_Rows] = []
        self._last: torch.Tensor | None = None  # (n_prompts, V) logits of the next token
        self._closed = False

    @property
    def n_prompts(self) -> int:
        return len(self._prompts)

    def _start_sync(self) -> None:
        eng = self._engine
        ids = [eng.encode(p)[1] for p in self._prompts]
        zero = self.zero_shot_index
        others = [i for i in range(self.n_prompts) if i != zero]
        self._groups = [_Rows([zero], [ids[zero]])]
        if others:
            self._groups.append(_Rows(others, [ids[i] for i in others]))
        for g in self._groups:
            if self.recompute:
                g.last = self._recompute_last(g)
                continue
            # One session is one call (and one context): its rows may share their prefix.
            scopes = [self._prompts[i].cache_scope for i in g.at]
            pre = prefill(eng, g.ids, scopes=scopes, use_cache=True)
            # Slots of the session's own (it outlives this engine call, so never the
            # engine's workspace): each token's keys and values are written in place.
            cache = pre.res.past_key_values
            if eng.slot_caches:
                cache = own_slots([(k, v) for k, v, *_ in cache], SESSION_ROOM)
            g.cache = cache
            g.attn = pre.attention_mask
            g.pos = pre.last_pos
            g.last = pre.res.logits[:, -1, :].float()
        self._last = self._assemble()

    def _assemble(self) -> torch.Tensor:
        """The groups' next-token logits in the session's prompt order."""
        lasts: list[torch.Tensor] = []
        for g in self._groups:
            assert g.last is not None
            lasts.append(g.last)
        first = lasts[0]
        out = torch.empty((self.n_prompts, first.shape[1]), dtype=first.dtype, device=first.device)
        for g, last in zip(self._groups, lasts, strict=True):
            out[g.at] = last
        return out

    def _recompute_last(self, g: _Rows) -> torch.Tensor:
        eng = self._engine
        batch = eng.left_pad([ids + self.suffix for ids in g.ids])
        res = eng.forward(batch.input_ids, batch.attention_mask, batch.position_ids, last_only=True)
        return res.logits[:, -1, :].float()  # type: ignore[no-any-return]

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the decoding session is closed")

    async def step(self) -> StepLogits:
        self._check_open()
        return await self._engine.run(self._step_sync)

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
        await self._engine.run(self._advance_sync, tok)

    def _advance_sync(self, tok: int) -> None:
        eng = self._engine
        self.suffix.append(tok)
        for g in self._groups:
            if self.recompute:
                g.last = self._recompute_last(g)
                continue
            assert g.attn is not None and g.pos is not None
            n = len(g.at)
            inp = torch.full((n, 1), tok, dtype=torch.long, device=eng.device)
            g.attn = torch.cat(
                [g.attn, torch.ones((n, 1), dtype=g.attn.dtype, device=eng.device)], 1
            )
            g.pos = g.pos + 1
            res = eng.forward(inp, g.attn, g.pos[:, None], past=g.cache, use_cache=True)
            g.cache = res.past_key_values
            g.last = res.logits[:, -1, :].float()
        self._last = self._assemble()

    def decode(self, token_ids: Sequence[int]) -> str:
        text = self._engine.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return str(text)

    async def aclose(self) -> None:
        self._closed = True
        self._groups = []
        self._last = None
