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

The past a batch continues from (shared prefix, cached prefixes stacked or in a slot cache)
and the forwards that build it: :mod:`dpicl.engines.transformers_past`. Label scoring:
:mod:`dpicl.engines.transformers_scoring`. Free-text generation:
:mod:`dpicl.engines.transformers_generation`. DPS-MOZO decoding:
:mod:`dpicl.engines.transformers_decoding`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Sequence
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
    left_pad,
)
from dpicl.engines.lm_head import use_blocked_lm_head
from dpicl.engines.prefix_cache import (
    PrefixCache,
    prefix_fingerprint,
)
from dpicl.engines.prompting import PromptEncoder
from dpicl.engines.slot_cache import KVWorkspace
from dpicl.engines.threads import ThreadPlan
from dpicl.engines.transformers_decoding import TransformersDecodingSession
from dpicl.engines.transformers_generation import GenJob, generate_jobs
from dpicl.engines.transformers_past import Row
from dpicl.engines.transformers_scoring import ScoreJob, score_jobs
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import EngineError, InvalidRequest

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "TransformersDecodingSession", "TransformersEngine"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_BATCH_TOKENS = 16_384
#: Attention implementations that take a dense 4D mask (the scoring branches need one).
_DENSE_MASK_ATTENTION = ("sdpa", SHARED_KV_SDPA, "eager")


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
        # torch's thread pools as the factory set them (DPICL_TORCH_THREADS); None: untouched.
        self.threads: ThreadPlan | None = None
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
            name="score",
        )
        self.generate_batcher: MicroBatcher[GenJob, list[str]] = MicroBatcher(
            self._run_generate_jobs,
            max_wait_s=self.tuning.batch_wait_ms / 1000,
            max_size=self.tuning.batch_max_prompts,
            name="generate",
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
        share_prefix: bool = True,
        tuning: EngineTuning | None = None,
    ) -> TransformersEngine:
        """Load a model directory (or a hub name available offline). Blocking: call it
        before the event loop starts serving, or through :func:`asyncio.to_thread`.

        torch's thread pools are process-wide: :func:`dpicl.engines.threads.apply_torch_threads`
        sets them (the factory does, from ``DPICL_TORCH_THREADS``).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

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

    def _encode_row(self, prompt: PromptSpec, call: str) -> Row:
        """``prompt`` encoded for a batch; ``call`` marks the call it came in, the scope of
        a prompt without a context (``PromptSpec.cache_scope``): rows of different scopes
        never share a prefix (:func:`~dpicl.engines.transformers_past.shared_past`)."""
        scope = prompt.cache_scope or call
        # The prompt that runs may be the fallback (PromptSpec.fallback): its own prefix
        # and cache key then apply.
        prompt, rendered, ids = self.encoder.encode_used(prompt)
        prefix = prompt.prefix_text
        if not (prompt.cache_key and prefix and self.prefix_cache.enabled):
            return Row(rendered, ids, scope=scope)
        # Where the prompt text sits inside the chat template (the template copies it
        # verbatim; if it did not, the row is simply not cached).
        at = rendered.find(prompt.text)
        if at < 0:
            return Row(rendered, ids, scope=scope)
        head = rendered[: at + len(prefix)]
        return Row(rendered, ids, (prompt.cache_key, prefix_fingerprint(head)), head, scope)

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
