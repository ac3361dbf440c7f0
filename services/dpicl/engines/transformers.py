"""The Hugging Face transformers engine: in-process, CPU or CUDA.

Every model call runs in a worker thread (:func:`asyncio.to_thread`) under one lock, so the
event loop stays free and the model sees one batch at a time. Batches are left padded with
explicit ``position_ids`` (``attention_mask.cumsum(-1) - 1``, clamped at 0), so a prompt's
logits do not depend on what it was batched with (up to float rounding, tested to 1e-4).
The tensor layouts are in :mod:`dpicl.engines.kv_layout`.

Prompts and labels are rendered and tokenised by :class:`~dpicl.engines.prompting.
PromptEncoder` (the convention the vLLM engine shares; its docstring has the rules): with a
chat template, ``PromptSpec.text`` is the single user message plus the generation prompt; a
label's tokens are those it has after the rendered prompt. A label's score is the total
log-probability of its tokens (not a trailing end-of-turn token), so it does not depend on
the other labels.

Shared prefixes. The prompts of one call usually share a long token prefix (the chat
template's system turn and the template's instructions). When it is at least
``MIN_SHARED_PREFIX`` tokens, it is encoded once and its KV cache copied to every row; each
row's remainder follows it left padded (``[prefix][pads][rest]``, pads masked, positions
continuing from the prefix). Batches are cut so that rows x width stays within
``max_batch_tokens`` (longest prompts first, to limit padding).

Per-context prefix reuse (:mod:`dpicl.engines.prefix_cache`). A prompt whose
``PromptSpec.cache_key`` is set (the server's pipelines set it to the context id and the
partition) has its query-independent start (``prefix_text``: the system turn, instructions
and that partition's exemplars) encoded once; its KV state is kept in a per-context LRU
and later calls run only the query and label tokens on top of it. Rows of one batch may
have cached prefixes of different lengths: each row's prefix KV is left padded to the
longest (``[pads][prefix][pads][rest]``, pads masked, each row's positions continuing from
its own prefix), so a row's logits are those of the uncached prompt up to float rounding
(tested to 1e-4). A row is only matched with an entry whose token ids its own token ids
start with, so a tokeniser that merges across the boundary costs a cache miss, never a
wrong score. Scoring and free-text generation use the cache; DPS-MOZO sessions do not.

Scoring cost: one forward pass over the rows' remaining tokens, each row followed by a
branch per multi-token label (:func:`~dpicl.engines.kv_layout.plan_scoring`: a 4D attention
mask keeps the branches apart), with logits computed only where a label token is read.

Batching across requests (:mod:`dpicl.engines.batching`). Concurrent ``score_labels``
calls that arrive together are merged into one batch (each row keeps its own labels and
prefix) and each call gets back exactly its own rows. A call whose prompts fail to encode
(too long) fails alone. Concurrent ``generate`` calls with the same settings are merged the
same way; each call samples from its own seeded generator, so its text does not depend on
what it was batched with (up to float rounding).

Label scoring: :mod:`dpicl.engines.transformers_scoring`. Free-text generation:
:mod:`dpicl.engines.transformers_generation`. DPS-MOZO decoding:
:mod:`dpicl.engines.transformers_decoding`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from dpicl.engines.attention import SHARED_KV_SDPA, use_shared_kv_sdpa
from dpicl.engines.base import FloatArray, GenerationParams, PromptSpec
from dpicl.engines.batching import MicroBatcher
from dpicl.engines.kv_layout import (
    Batch,
    chunks,
    common_prefix_len,
    left_pad,
    pack_layers,
    prefix_mask,
    slot_prefixes,
    stack_packed,
    stack_prefixes,
)
from dpicl.engines.lm_head import use_blocked_lm_head
from dpicl.engines.prefix_cache import (
    PrefixCache,
    PrefixEntry,
    prefix_fingerprint,
    prefix_lens,
)
from dpicl.engines.prompting import PromptEncoder
from dpicl.engines.slot_cache import KVWorkspace, SlotCache
from dpicl.engines.transformers_decoding import TransformersDecodingSession
from dpicl.engines.transformers_generation import GenJob, Row, generate_jobs
from dpicl.engines.transformers_scoring import ScoreJob, score_jobs
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import EngineError, InvalidRequest

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "TransformersDecodingSession", "TransformersEngine"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_BATCH_TOKENS = 16_384
MIN_SHARED_PREFIX = 8
#: Attention implementations that take a dense 4D mask (the scoring branches need one).
_DENSE_MASK_ATTENTION = ("sdpa", SHARED_KV_SDPA, "eager")


@dataclass(frozen=True, slots=True)
class _Past:
    """The KV state a batch's rows continue from: row b's tokens before ``offsets[b]``."""

    cache: Any  # a transformers Cache, or None when there is no past
    mask: torch.Tensor  # (B, W) long: which cached positions are real
    offsets: list[int]


@dataclass(frozen=True, slots=True)
class _Prefill:
    """The result of encoding a batch of prompts."""

    res: Any  # the model output: .logits (B, 1, V) unless encoded without, .past_key_values
    attention_mask: torch.Tensor  # (B, S) long, over everything in the cache
    last_pos: torch.Tensor  # (B,) long: position id of each row's last token


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


def _device_of(model: Any) -> torch.device:
    """The device of the model's first parameter (CPU for a model without any)."""
    for param in model.parameters():
        return torch.device(param.device)
    return torch.device("cpu")


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
        device: str | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        use_chat_template: bool = True,
        share_prefix: bool = True,
        tuning: EngineTuning | None = None,
    ) -> None:
        if max_batch_tokens < 1:
            raise EngineError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        # The inputs go where the weights are: a second engine over a loaded model (another
        # tuning, a benchmark's sibling) cannot end up feeding CPU tensors to a GPU model.
        where = torch.device(device) if device is not None else _device_of(model)
        attn = getattr(model.config, "_attn_implementation", None) or "eager"
        if attn == "sdpa" and where.type == "cpu":
            attn = use_shared_kv_sdpa(model)  # grouped K/V heads not copied per layer
        if where.type == "cpu":
            use_blocked_lm_head(model)  # the vocabulary projection in cache-sized blocks
        if attn not in _DENSE_MASK_ATTENTION:
            raise EngineError(
                f"attention implementation {attn!r} is not supported: the engine needs one "
                f"of {', '.join(_DENSE_MASK_ATTENTION)} (dense 4D attention masks)"
            )
        self._attention: str = attn
        self.model_obj: Any = model
        self.tokenizer: Any = tokenizer
        self.model: str = model_name
        self.device = where
        self.max_batch_tokens = max_batch_tokens
        max_pos = getattr(model.config, "max_position_embeddings", None)
        self.max_positions: int | None = int(max_pos) if max_pos else None
        self.encoder = PromptEncoder(
            tokenizer,
            model_name=model_name,
            use_chat_template=use_chat_template,
            max_positions=self.max_positions,
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
        self.share_prefix = share_prefix
        self._lock = threading.Lock()
        self._closed = False
        self.tuning = tuning if tuning is not None else EngineTuning()
        self.prefix_cache = PrefixCache(
            self.tuning.prefix_cache_bytes, self.tuning.prefix_cache_entries
        )
        self.kv_workspace = KVWorkspace(self.tuning.kv_workspace_bytes)
        # False: scoring and generation batches stack cached prefixes in a DynamicCache
        # instead of a SlotCache (the path before; bench/voting.py compares the two).
        self.slot_caches = True
        self.score_batcher: MicroBatcher[ScoreJob, FloatArray] = MicroBatcher(
            self._run_score_jobs,
            max_wait_s=self.tuning.batch_wait_ms / 1000,
            max_size=self.tuning.batch_max_prompts,
        )
        self.generate_batcher: MicroBatcher[GenJob, list[str]] = MicroBatcher(
            self._run_generate_jobs,
            max_wait_s=self.tuning.batch_wait_ms / 1000,
            max_size=self.tuning.batch_max_prompts,
        )

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
        tuning: EngineTuning | None = None,
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
            tuning=tuning,
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

    # ------------------------------------------------------------------ prompts

    @property
    def use_chat_template(self) -> bool:
        return self.encoder.use_chat_template

    def render(self, prompt: PromptSpec) -> str:
        """The string the model sees for ``prompt`` (chat template applied if enabled)."""
        return self.encoder.render(prompt)

    def encode(self, prompt: PromptSpec) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids (a 4xx if the model cannot take it)."""
        return self.encoder.encode(prompt)

    def label_ids(self, rendered_prompt: str, label: str) -> list[int]:
        """Token ids of ``label`` as the answer that follows ``rendered_prompt``."""
        return self.encoder.label_ids(rendered_prompt, label)

    def _encode_row(self, prompt: PromptSpec) -> Row:
        rendered, ids = self.encode(prompt)
        prefix = prompt.prefix_text
        if not (prompt.cache_key and prefix and self.prefix_cache.enabled):
            return Row(rendered, ids)
        # Where the prompt text sits inside the chat template (the template copies it
        # verbatim; if it did not, the row is simply not cached).
        at = rendered.find(prompt.text)
        if at < 0:
            return Row(rendered, ids)
        head = rendered[: at + len(prefix)]
        return Row(rendered, ids, (prompt.cache_key, prefix_fingerprint(head)), head)

    # ------------------------------------------------------------------ batches

    def _left_pad(self, seqs: Sequence[Sequence[int]]) -> Batch:
        return left_pad(seqs, self.pad_token_id, self.device)

    def _chunks(self, costs: Sequence[int], widths: Sequence[int]) -> list[list[int]]:
        return chunks(costs, widths, self.max_batch_tokens)

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *,
        past: Any = None,
        use_cache: bool = False,
        last_only: bool = False,
        logits: bool = True,
    ) -> Any:
        """The model's forward; ``logits=False`` runs only its decoder (``base_model``:
        hidden states and cache), skipping the vocabulary projection a prefix encoding never
        reads."""
        kwargs: dict[str, Any] = {}
        if not logits:
            return self.model_obj.base_model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past,
                use_cache=use_cache,
            )
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

    def _shared_past(self, seqs: Sequence[Sequence[int]]) -> _Past:
        """The rows' common token prefix encoded once and copied to every row, when it is
        at least ``MIN_SHARED_PREFIX`` tokens (and leaves every row a token); else none."""
        n = len(seqs)
        shared = common_prefix_len(seqs) if n > 1 else 0
        shared = min(shared, min(len(s) for s in seqs) - 1)
        if shared < MIN_SHARED_PREFIX or not self.share_prefix:
            return _Past(None, torch.zeros((n, 0), dtype=torch.long, device=self.device), [0] * n)
        prefix = torch.tensor([list(seqs[0][:shared])], dtype=torch.long, device=self.device)
        ones = torch.ones((1, shared), dtype=torch.long, device=self.device)
        res0 = self._forward(
            prefix,
            ones,
            torch.arange(shared, device=self.device)[None, :],
            use_cache=True,
            logits=False,
        )
        cache = res0.past_key_values
        cache.batch_repeat_interleave(n)
        return _Past(cache, ones.expand(n, shared), [shared] * n)

    def _found_prefixes(self, rows: Sequence[Row]) -> list[PrefixEntry | None]:
        """Each row's cached prefix (encoded now when missing), or None: the row has no
        cache slot, or its tokens do not start with the entry's."""
        if not any(r.slot is not None for r in rows):
            return [None] * len(rows)
        entries = self._prefix_entries(rows)
        found = [entries.get(r.slot) if r.slot is not None else None for r in rows]
        return [
            e if e is not None and e.matches(r.ids) else None
            for e, r in zip(found, rows, strict=True)
        ]

    def _rows_past(
        self, rows: Sequence[Row], found: Sequence[PrefixEntry | None] | None = None
    ) -> _Past:
        """The rows' cached prefixes (``found``: as :meth:`_found_prefixes` gives them)
        stacked (``[pads][prefix]``) when any row has one, else :meth:`_shared_past`."""
        if found is None:
            found = self._found_prefixes(rows)
        if any(e is not None for e in found):
            from transformers import DynamicCache

            lens = prefix_lens(found)
            if all(e is None or e.packed is not None for e in found):
                layers, mask = stack_packed(
                    [e.packed if e is not None else None for e in found], lens, self.device
                )
            else:
                layers, mask = stack_prefixes(
                    [e.layers if e is not None else None for e in found], lens, self.device
                )
            return _Past(DynamicCache(ddp_cache_data=layers), mask, lens)
        return self._shared_past([r.ids for r in rows])

    def _prefill_on(
        self, seqs: Sequence[Sequence[int]], past: _Past, *, use_cache: bool, logits: bool = True
    ) -> _Prefill:
        """One forward over each row's tokens after its past (logits of the last only, or
        none with ``logits=False``)."""
        rest = self._left_pad([s[o:] for s, o in zip(seqs, past.offsets, strict=True)])
        offset = torch.tensor(past.offsets, dtype=torch.long, device=self.device)
        attn = torch.cat([past.mask, rest.attention_mask], dim=1)
        res = self._forward(
            rest.input_ids,
            attn,
            rest.position_ids + offset[:, None],
            past=past.cache,
            use_cache=use_cache or past.cache is not None,
            last_only=True,
            logits=logits,
        )
        return _Prefill(res, attn, rest.last_pos + offset)

    def _prefill(
        self, seqs: Sequence[Sequence[int]], *, use_cache: bool, logits: bool = True
    ) -> _Prefill:
        """One forward over ``seqs`` on their shared prefix (see :meth:`_shared_past`)."""
        return self._prefill_on(seqs, self._shared_past(seqs), use_cache=use_cache, logits=logits)

    def _slottable(self, found: Sequence[PrefixEntry | None]) -> bool:
        """Whether :meth:`_slot_past` can lay out these rows' cached prefixes: some row has
        one, every one is packed, and slot caches are on."""
        return (
            self.slot_caches
            and any(e is not None for e in found)
            and all(e is None or e.packed is not None for e in found)
        )

    def _slot_past(self, found: Sequence[PrefixEntry | None], room: int) -> _Past:
        """The rows' cached prefixes (``found``, :meth:`_slottable`) laid out in a
        :class:`~dpicl.engines.slot_cache.SlotCache` with ``room`` slots after them, in the
        engine's workspace: valid only until the workspace's next use, so only for a cache
        that dies with the current engine call."""
        packs = [e.packed if e is not None else None for e in found]
        lens = prefix_lens(found)
        template = next(p for p in packs if p is not None)
        n_layers, _, heads, _, dim = template.shape
        shape = (n_layers, 2, len(found), heads, max(lens) + room, dim)
        slots = slot_prefixes(packs, lens, room, self.kv_workspace.take(shape, template))
        return _Past(SlotCache(slots, max(lens)), prefix_mask(lens, self.device), lens)

    def _prefill_rows(self, rows: Sequence[Row], *, decode_steps: int) -> _Prefill:
        """:meth:`_prefill` over encoded rows, on top of their cached prefixes if any, with
        the cache kept for ``decode_steps`` more tokens per row (in the engine's workspace
        when the prefixes are cached: for decoding within the current engine call only)."""
        found = self._found_prefixes(rows)
        if self._slottable(found):
            lens = prefix_lens(found)
            width = max(len(r.ids) - n for r, n in zip(rows, lens, strict=True))
            past = self._slot_past(found, width + decode_steps)
        else:
            past = self._rows_past(rows, found)
        return self._prefill_on([r.ids for r in rows], past, use_cache=True)

    def _prefix_entries(self, rows: Sequence[Row]) -> dict[tuple[str, str], PrefixEntry]:
        """The cache entries for the rows' prefixes; missing ones are encoded (one batch)
        and stored. The returned dict keeps them alive for this batch even if evicted."""
        have: dict[tuple[str, str], PrefixEntry] = {}
        todo: dict[tuple[str, str], list[int]] = {}
        for r in rows:
            if r.slot is None or r.slot in have or r.slot in todo:
                continue
            entry = self.prefix_cache.get(r.slot)
            if entry is not None:
                have[r.slot] = entry
                continue
            own = self.encoder.encode_text(r.rendered_prefix, special=not self.use_chat_template)
            n = common_prefix_len([own, r.ids])
            # Leave the prefix's last token to the query side: it is the one a tokeniser
            # may merge with the query's first characters.
            n = min(n, len(own) - 1, len(r.ids) - 1)
            if n >= 1:
                todo[r.slot] = r.ids[:n]
        if todo:
            keys = list(todo)
            pre = self._prefill([todo[k] for k in keys], use_cache=True, logits=False)
            kv = [(k, v) for k, v, *_ in pre.res.past_key_values]
            for b, key in enumerate(keys):
                real = pre.attention_mask[b].nonzero()[:, 0]
                packed, layers = pack_layers(
                    [
                        (k[b : b + 1].index_select(2, real), v[b : b + 1].index_select(2, real))
                        for k, v in kv
                    ]
                )
                entry = PrefixEntry(tuple(todo[key]), layers, packed)
                self.prefix_cache.put(key, entry)
                have[key] = entry
            del pre, kv
        return have

    # ------------------------------------------------------------------ scoring

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        if not labels:
            raise InvalidRequest("at least one label is needed", param="labels")
        if not prompts:
            return np.zeros((0, len(labels)), dtype=np.float64)
        if self._closed:
            raise EngineError("the transformers engine is closed")
        job: ScoreJob = (list(prompts), list(labels))
        return await self.score_batcher.submit(job, size=len(job[0]))

    async def _run_score_jobs(self, jobs: list[ScoreJob]) -> list[FloatArray | BaseException]:
        return await self._run(score_jobs, self, jobs)

    # ------------------------------------------------------------------ generation

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        params.check()
        if not prompts:
            return []
        if self._closed:
            raise EngineError("the transformers engine is closed")
        job: GenJob = (list(prompts), params)
        return await self.generate_batcher.submit(job, size=len(job[0]))

    async def _run_generate_jobs(self, jobs: list[GenJob]) -> list[list[str] | BaseException]:
        return await self._run(generate_jobs, self, jobs)

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
            self.kv_workspace.release()
            gc.collect()
            if self.device.type == "cuda":  # pragma: no cover - GPU only
                torch.cuda.empty_cache()

        await asyncio.to_thread(self._locked, _release)
