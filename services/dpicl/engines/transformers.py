"""The Hugging Face transformers engine: in-process, CPU or CUDA.

Every model call runs in a worker thread (:func:`asyncio.to_thread`) under one lock, so the
event loop stays free and the model sees one batch at a time. Batches are left padded with
explicit ``position_ids`` (``attention_mask.cumsum(-1) - 1``, clamped at 0), so a prompt's
logits do not depend on what it was batched with (up to float rounding, tested to 1e-4).

Shared prefixes. The prompts of one call usually share a long token prefix (the chat
template's system turn and the template's instructions). When it is at least
``MIN_SHARED_PREFIX`` tokens, it is encoded once and its KV cache copied to every row; each
row's remainder follows it left padded (``[prefix][pads][rest]``, pads masked, positions
continuing from the prefix). On realistic voting prompts this cuts about a quarter of the
work, more for audit prompts with long instructions. Batches are also cut so that rows x
width stays within ``max_batch_tokens`` (longest prompts first, to limit padding).

Prompts. With ``use_chat_template`` (the default) and a tokenizer that has a chat template,
``PromptSpec.text`` becomes the single user message and the template's generation prompt
is appended (for SmolLM2: ``...<|im_start|>assistant\\n``); otherwise the text is used as
it is (with the tokenizer's BOS token, if it adds one).

Label tokenisation (``score_labels``). A label is tokenised as it would appear in the
rendered prompt string followed by the label: directly after the prompt when the rendered
prompt ends with whitespace (always the case after a chat template's generation prompt,
which ends with a newline), after one space otherwise (a raw prompt ending in
``"Label:"`` is answered ``" Positive"``). The label's tokens are those of
``tail + sep + label`` beyond those of ``tail``, where ``tail`` is the prompt's last 64
characters; if the tokeniser merges across that boundary the label is tokenised on its own.
The score is the total log-probability of the label's tokens (not a trailing end-of-turn
token), so a label's score does not depend on the other labels.

Scoring cost: one forward pass over the N prompts gives every label's first token; labels
of more than one token are finished by one more forward pass over their remaining tokens
(N x L_multi short rows) that reuses the prompts' KV cache, so a prompt is never encoded
twice.

DPS-MOZO decoding (:meth:`TransformersEngine.open_decoding`) encodes the prompts once,
keeps the KV cache, and advances all rows with one single-token forward per generated
token. ``recompute=True`` opens a reference session that re-runs the full prompts plus
suffix at every step (no cache); the benchmark and the tests compare the two.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from dpicl.engines.base import (
    FloatArray,
    GenerationParams,
    PromptSpec,
    StepLogits,
)
from dpicl.errors import EngineError, InvalidRequest

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "TransformersDecodingSession", "TransformersEngine"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_BATCH_TOKENS = 16_384
_TAIL_CHARS = 64
MIN_SHARED_PREFIX = 8


@dataclass(frozen=True, slots=True)
class _Batch:
    """A left-padded batch."""

    input_ids: torch.Tensor  # (B, S) long
    attention_mask: torch.Tensor  # (B, S) long
    position_ids: torch.Tensor  # (B, S) long
    last_pos: torch.Tensor  # (B,) long: position id of each row's last real token


@dataclass(frozen=True, slots=True)
class _Prefill:
    """The result of encoding a batch of prompts."""

    res: Any  # the model output: .logits (B, 1, V), .past_key_values
    attention_mask: torch.Tensor  # (B, S) long, over everything in the cache
    last_pos: torch.Tensor  # (B,) long: position id of each row's last token


def _common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        tok = first[i]
        if any(s[i] != tok for s in seqs):
            return i
    return n


def _dtype_of(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        value = getattr(torch, dtype)
    except AttributeError:
        value = None
    if not isinstance(value, torch.dtype):
        raise EngineError(f"unknown torch dtype {dtype!r}")
    return value


class TransformersEngine:
    """An :class:`~dpicl.engines.base.Engine` backed by a transformers causal LM."""

    name: str = "transformers"
    is_simulator: bool = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str,
        device: str = "cpu",
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        use_chat_template: bool = True,
        share_prefix: bool = True,
    ) -> None:
        if max_batch_tokens < 1:
            raise EngineError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.model_obj: Any = model
        self.tokenizer: Any = tokenizer
        self.model: str = model_name
        self.device = torch.device(device)
        self.max_batch_tokens = max_batch_tokens
        self.use_chat_template = bool(
            use_chat_template and getattr(tokenizer, "chat_template", None)
        )
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_token_id: int = int(pad)
        self.eos_token_ids: frozenset[int] = self._collect_eos(model, tokenizer)
        eos = tokenizer.eos_token_id
        self.eos_token_id: int = (
            int(eos) if eos is not None else min(self.eos_token_ids, default=self.pad_token_id)
        )
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0])
        max_pos = getattr(model.config, "max_position_embeddings", None)
        self.max_positions: int | None = int(max_pos) if max_pos else None
        self.share_prefix = share_prefix
        self._lock = threading.Lock()
        self._label_cache: dict[tuple[str, str], list[int]] = {}
        self._closed = False

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        model_path: str | Path,
        *,
        device: str = "cpu",
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        use_chat_template: bool = True,
        dtype: torch.dtype | str = "float32",
        model_name: str | None = None,
        num_threads: int | None = None,
        share_prefix: bool = True,
    ) -> TransformersEngine:
        """Load a model directory (or a hub name available offline). Blocking: call it
        before the event loop starts serving, or through :func:`asyncio.to_thread`.

        ``num_threads`` sets torch's intra-op threads (process-wide); ``None`` leaves it.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if num_threads is not None:
            torch.set_num_threads(max(1, num_threads))
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(f"device {device!r} was asked for but CUDA is not available")
        src = str(model_path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(src)
            model: Any = AutoModelForCausalLM.from_pretrained(src, dtype=_dtype_of(dtype))
        except (OSError, ValueError) as exc:
            raise EngineError(f"cannot load the model {src!r}: {exc}") from exc
        model.to(dev)
        model.eval()
        tokenizer.padding_side = "left"
        name = model_name or (Path(src).name if Path(src).is_dir() else src)
        return cls(
            model,
            tokenizer,
            model_name=name,
            device=str(dev),
            max_batch_tokens=max_batch_tokens,
            use_chat_template=use_chat_template,
            share_prefix=share_prefix,
        )

    @staticmethod
    def _collect_eos(model: Any, tokenizer: Any) -> frozenset[int]:
        ids: set[int] = set()
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        gen = getattr(model, "generation_config", None)
        gen_eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, list | tuple):
            ids.update(int(i) for i in gen_eos)
        return frozenset(ids)

    # ------------------------------------------------------------------ plumbing

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise EngineError("the transformers engine is closed")
        return await asyncio.to_thread(self._locked, fn, *args)

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock, torch.inference_mode():
            if self._closed:
                raise EngineError("the transformers engine is closed")
            try:
                return fn(*args)
            except torch.cuda.OutOfMemoryError as exc:  # pragma: no cover - GPU only
                raise EngineError(f"the model ran out of GPU memory: {exc}") from exc

    def render(self, prompt: PromptSpec) -> str:
        """The string the model sees for ``prompt`` (chat template applied if enabled)."""
        if not self.use_chat_template:
            return prompt.text
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}],
            tokenize=False,
            add_generation_prompt=True,
        )
        return str(rendered)

    def _encode_text(self, text: str, *, special: bool) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=special)["input_ids"]]

    def encode(self, prompt: PromptSpec) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids."""
        rendered = self.render(prompt)
        # A chat template writes its own special tokens; a raw prompt gets the tokenizer's.
        ids = self._encode_text(rendered, special=not self.use_chat_template)
        if not ids:
            ids = [
                self.pad_token_id
                if self.tokenizer.bos_token_id is None
                else int(self.tokenizer.bos_token_id)
            ]
        if self.max_positions is not None and len(ids) >= self.max_positions:
            raise InvalidRequest(
                f"the prompt has {len(ids)} tokens; the model {self.model!r} accepts fewer "
                f"than {self.max_positions}"
            )
        return rendered, ids

    def label_ids(self, rendered_prompt: str, label: str) -> list[int]:
        """Token ids of ``label`` as the answer that follows ``rendered_prompt``."""
        tail = rendered_prompt[-_TAIL_CHARS:]
        key = (tail, label)
        cached = self._label_cache.get(key)
        if cached is not None:
            return cached
        sep = "" if (not tail or tail[-1].isspace()) else " "
        base = self._encode_text(tail, special=False)
        full = self._encode_text(tail + sep + label, special=False)
        if len(full) > len(base) and full[: len(base)] == base:
            ids = full[len(base) :]
        else:
            ids = self._encode_text(sep + label, special=False)
        if not ids:
            raise InvalidRequest(f"the label {label!r} has no tokens", param="labels")
        if len(self._label_cache) > 4096:
            self._label_cache.clear()
        self._label_cache[key] = ids
        return ids

    def _left_pad(self, seqs: Sequence[Sequence[int]]) -> _Batch:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            if s:
                ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
                mask[i, width - len(s) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, pos = ids.to(self.device), mask.to(self.device), pos.to(self.device)
        return _Batch(ids, mask, pos, pos[:, -1].clone())

    def _chunks(self, costs: Sequence[int], widths: Sequence[int]) -> list[list[int]]:
        """Group row indices (longest first) so that rows x width x cost factor stays
        within ``max_batch_tokens``; a row that alone exceeds it goes alone."""
        order = sorted(range(len(widths)), key=lambda i: -widths[i])
        chunks: list[list[int]] = []
        cur: list[int] = []
        cur_width = 0
        cur_cost = 0
        for i in order:
            w = max(cur_width, widths[i])
            c = cur_cost + costs[i]
            if cur and w * c > self.max_batch_tokens:
                chunks.append(cur)
                cur, w, c = [], widths[i], costs[i]
            cur.append(i)
            cur_width, cur_cost = w, c
        if cur:
            chunks.append(cur)
        return chunks

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        past: Any = None,
        use_cache: bool = False,
        last_only: bool = False,
    ) -> Any:
        kwargs: dict[str, Any] = {}
        if last_only:
            kwargs["logits_to_keep"] = 1
        return self.model_obj(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past,
            use_cache=use_cache,
            **kwargs,
        )

    def _prefill(self, seqs: Sequence[Sequence[int]], *, use_cache: bool) -> _Prefill:
        """One forward over ``seqs`` (logits of each row's last token only).

        When the rows share a common token prefix of at least ``MIN_SHARED_PREFIX`` tokens
        (the chat template's system turn and the template's instructions usually are), the
        prefix is encoded once and its KV cache copied to every row; the rest of each row
        follows it left padded: ``[prefix][pad...][rest]`` with the pads masked out and
        positions continuing from the prefix. Otherwise the rows are simply left padded.
        """
        n = len(seqs)
        shared = _common_prefix_len(seqs) if n > 1 else 0
        shared = min(shared, min(len(s) for s in seqs) - 1)
        if shared < MIN_SHARED_PREFIX or not self.share_prefix:
            batch = self._left_pad(seqs)
            res = self._forward(
                batch.input_ids,
                batch.attention_mask,
                batch.position_ids,
                use_cache=use_cache,
                last_only=True,
            )
            return _Prefill(res, batch.attention_mask, batch.last_pos)
        prefix = torch.tensor([list(seqs[0][:shared])], dtype=torch.long, device=self.device)
        ones = torch.ones((1, shared), dtype=torch.long, device=self.device)
        res0 = self._forward(
            prefix,
            ones,
            torch.arange(shared, device=self.device)[None, :],
            use_cache=True,
            last_only=True,
        )
        cache = res0.past_key_values
        cache.batch_repeat_interleave(n)
        rest = self._left_pad([s[shared:] for s in seqs])
        attn = torch.cat([ones.expand(n, shared), rest.attention_mask], dim=1)
        res = self._forward(
            rest.input_ids,
            attn,
            rest.position_ids + shared,
            past=cache,
            use_cache=True,
            last_only=True,
        )
        return _Prefill(res, attn, rest.last_pos + shared)

    # ------------------------------------------------------------------ scoring

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        if not labels:
            raise InvalidRequest("at least one label is needed", param="labels")
        if not prompts:
            return np.zeros((0, len(labels)), dtype=np.float64)
        return await self._run(self._score_sync, list(prompts), list(labels))

    def _score_sync(self, prompts: list[PromptSpec], labels: list[str]) -> FloatArray:
        encoded = [self.encode(p) for p in prompts]
        lab_ids = [[self.label_ids(r, lab) for lab in labels] for r, _ in encoded]
        out = np.empty((len(prompts), len(labels)), dtype=np.float64)
        widths = [len(ids) for _, ids in encoded]
        # A prompt with m multi-token labels costs (1 + m) cache rows in the second pass.
        costs = [1 + sum(len(x) > 1 for x in row) for row in lab_ids]
        for chunk in self._chunks(costs, widths):
            self._score_chunk(chunk, [encoded[i][1] for i in chunk], lab_ids, out)
        return out

    def _score_chunk(
        self,
        rows: list[int],
        seqs: list[list[int]],
        lab_ids: list[list[list[int]]],
        out: FloatArray,
    ) -> None:
        pre = self._prefill(seqs, use_cache=any(len(x) > 1 for r in rows for x in lab_ids[r]))
        res = pre.res
        pairs = [
            (b, j) for b, r in enumerate(rows) for j, ids in enumerate(lab_ids[r]) if len(ids) > 1
        ]
        last = res.logits[:, -1, :].float()  # (B, V)
        norm = torch.logsumexp(last, dim=-1)  # (B,)
        first = torch.tensor(
            [[lab_ids[r][j][0] for j in range(len(lab_ids[r]))] for r in rows],
            dtype=torch.long,
            device=last.device,
        )
        first_lp = (last.gather(1, first) - norm[:, None]).double().cpu().numpy()
        for b, r in enumerate(rows):
            out[r, :] = first_lp[b]
        if not pairs:
            return
        # Second pass: every multi-token label's remaining tokens, all (prompt, label)
        # pairs as one batch over copies of the prompts' KV cache.
        cache = res.past_key_values
        src = torch.tensor([b for b, _ in pairs], dtype=torch.long, device=self.device)
        cache.reorder_cache(src)
        conts = [lab_ids[rows[b]][j] for b, j in pairs]
        width = max(len(c) - 1 for c in conts)
        inp = torch.full((len(pairs), width), self.pad_token_id, dtype=torch.long)
        cmask = torch.zeros((len(pairs), width), dtype=torch.long)
        for p, c in enumerate(conts):
            inp[p, : len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
            cmask[p, : len(c) - 1] = 1
        inp, cmask = inp.to(self.device), cmask.to(self.device)
        attn = torch.cat([pre.attention_mask.index_select(0, src), cmask], dim=1)
        steps = torch.arange(width, device=self.device)
        pos = pre.last_pos.index_select(0, src)[:, None] + 1 + steps[None, :]
        res2 = self._forward(inp, attn, pos, past=cache, use_cache=True)
        logits = res2.logits.float()  # (P, width, V)
        norm2 = torch.logsumexp(logits, dim=-1)  # (P, width)
        for p, ((b, j), c) in enumerate(zip(pairs, conts, strict=True)):
            n = len(c) - 1
            tgt = torch.tensor(c[1:], dtype=torch.long, device=self.device)
            lp = logits[p, :n, :].gather(1, tgt[:, None])[:, 0] - norm2[p, :n]
            out[rows[b], j] += float(lp.double().sum().item())
        del cache, res, res2

    # ------------------------------------------------------------------ generation

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        if params.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1", param="max_tokens")
        if params.temperature < 0:
            raise InvalidRequest("temperature must be >= 0", param="temperature")
        if not prompts:
            return []
        return await self._run(self._generate_sync, list(prompts), params)

    def _generate_sync(self, prompts: list[PromptSpec], params: GenerationParams) -> list[str]:
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed) % (2**63))
        encoded = [self.encode(p)[1] for p in prompts]
        widths = [len(ids) + params.max_tokens for ids in encoded]
        texts: list[str] = [""] * len(prompts)
        for chunk in self._chunks([1] * len(prompts), widths):
            outs = self._generate_chunk([encoded[i] for i in chunk], params, gen)
            for i, text in zip(chunk, outs, strict=True):
                texts[i] = text
        return texts

    def _sample(
        self, logits: torch.Tensor, temperature: float, gen: torch.Generator
    ) -> torch.Tensor:
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=gen)[:, 0]

    def _generate_chunk(
        self, seqs: list[list[int]], params: GenerationParams, gen: torch.Generator
    ) -> list[str]:
        n = len(seqs)
        pre = self._prefill(seqs, use_cache=True)
        cache = pre.res.past_key_values
        logits = pre.res.logits[:, -1, :]
        attn = pre.attention_mask
        pos = pre.last_pos
        out: list[list[int]] = [[] for _ in range(n)]
        done = [False] * n
        texts: list[str | None] = [None] * n
        eos = self.eos_token_ids
        for step in range(params.max_tokens):
            nxt = self._sample(logits, params.temperature, gen).tolist()
            for b in range(n):
                if done[b]:
                    continue
                tok = int(nxt[b])
                if tok in eos:
                    done[b] = True
                    continue
                out[b].append(tok)
                if params.stop:
                    text = self.tokenizer.decode(out[b], skip_special_tokens=True)
                    cut = min((text.find(s) for s in params.stop if s and s in text), default=-1)
                    if cut >= 0:
                        texts[b] = text[:cut]
                        done[b] = True
            if all(done) or step == params.max_tokens - 1:
                break
            tokens = torch.tensor(
                [self.pad_token_id if done[b] else int(nxt[b]) for b in range(n)],
                dtype=torch.long,
                device=self.device,
            )[:, None]
            attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=attn.device)], 1)
            pos = pos + 1
            res = self._forward(tokens, attn, pos[:, None], past=cache, use_cache=True)
            logits = res.logits[:, -1, :]
        result = []
        for b in range(n):
            text = texts[b]
            if text is None:
                text = self.tokenizer.decode(out[b], skip_special_tokens=True)
            result.append(text.strip())
        return result

    # ------------------------------------------------------------------ DPS-MOZO

    async def open_decoding(
        self,
        prompts: Sequence[PromptSpec],
        *,
        zero_shot_index: int,
        top_k: int,
        recompute: bool = False,
    ) -> TransformersDecodingSession:
        """Open a DPS-MOZO decoding session. The prompts are encoded once here (KV cache);
        ``recompute=True`` gives the cache-free reference session instead."""
        if not prompts:
            raise InvalidRequest("a decoding session needs at least one prompt")
        if not 0 <= zero_shot_index < len(prompts):
            raise InvalidRequest(
                f"zero_shot_index {zero_shot_index} is out of range for {len(prompts)} prompts"
            )
        if top_k < 1:
            raise InvalidRequest(f"top_k must be >= 1, got {top_k}", param="top_k")
        session = TransformersDecodingSession(
            self,
            list(prompts),
            zero_shot_index=zero_shot_index,
            top_k=min(top_k, self.vocab_size),
            recompute=recompute,
        )
        await self._run(session._start_sync)
        return session

    async def aclose(self) -> None:
        if self._closed:
            return

        def _release() -> None:
            self._closed = True
            self.model_obj = None
            gc.collect()
            if self.device.type == "cuda":  # pragma: no cover - GPU only
                torch.cuda.empty_cache()

        await asyncio.to_thread(self._locked, _release)


class TransformersDecodingSession:
    """A DPS-MOZO session over one :class:`TransformersEngine` (see module docstring)."""

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
        pre = eng._prefill(self._prompt_ids, use_cache=True)
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
