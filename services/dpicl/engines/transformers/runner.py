"""The model runner of the transformers engine: the loaded model, its tokenizer and device,
and the calls every entry point (scoring, generation, DPS-MOZO decoding) runs it through.

:class:`ModelRunner` holds what a batch needs: the model, the prompt encoder, the pad and
end-of-sequence ids, the per-context prefix cache and the reused KV workspace, and the
model lock. Its calls are the forward (:meth:`ModelRunner.forward`), left padding and the
cutting of batches to ``max_batch_tokens``, the encoding of a prompt into a batch row, and
:meth:`ModelRunner.run`, which runs a function in a worker thread under the lock and
``torch.inference_mode``. The helpers (:mod:`~dpicl.engines.transformers.past`,
``_scoring``, ``_generation``, ``_decoding``) take a runner; the engine
(:class:`~.engine.TransformersEngine`) is a runner plus the
:class:`~dpicl.engines.base.Engine` protocol (micro-batchers, sessions, loading), so the
helpers never import the engine.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from dpicl.engines.base import PromptSpec
from dpicl.engines.prompting import EncodedPrompt, PromptEncoder, PromptTokenizer
from dpicl.engines.threads import ThreadPlan
from dpicl.engines.transformers.attention import SHARED_KV_SDPA, use_shared_kv_sdpa
from dpicl.engines.transformers.kv_layout import Batch, chunks, left_pad
from dpicl.engines.transformers.lm_head import use_blocked_lm_head
from dpicl.engines.transformers.prefix_cache import PrefixCache
from dpicl.engines.transformers.shared_prefix import (
    SHARED_PREFIX_ATTENTION,
    use_shared_prefix_attention,
)
from dpicl.engines.transformers.slot_cache import KVWorkspace
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import EngineError

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "ModelRunner", "Row"]

T = TypeVar("T")

DEFAULT_MAX_BATCH_TOKENS = 16_384
#: Attention implementations that take a dense 4D mask (the scoring branches need one).
_DENSE_MASK_ATTENTION = ("sdpa", SHARED_KV_SDPA, SHARED_PREFIX_ATTENTION, "eager")


@dataclass(frozen=True, slots=True)
class Row:
    """One encoded prompt: the model's text, its token ids and, when its prefix may be
    cached, the cache key ``(cache_key, fingerprint)`` and the rendered prefix text.
    ``scope`` says which rows may share computed state with it (:func:`shared_past`): its
    context's id (``PromptSpec.cache_scope``), or a marker of the call it came in.
    ``prefix_len``: the leading tokens whose KV state may be cached under ``slot``, as the
    server's side computed them (:class:`~dpicl.engines.prompting.EncodedPrompt`)."""

    ids: list[int]
    slot: tuple[str, str] | None = None
    scope: str = ""
    prefix_len: int = 0


def _device_of(model: Any) -> torch.device:
    """The device of the model's first parameter (CPU for a model without any)."""
    for param in model.parameters():
        return torch.device(param.device)
    return torch.device("cpu")


def _kv_width(config: Any) -> int:
    """K/V channels a token and layer: K/V heads x head size."""
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return kv_heads * int(head_dim)


def _free_device_bytes(device: torch.device) -> int | None:
    """The memory free on a CUDA device (None on any other)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)  # pragma: no cover - GPU only
    return int(free)  # pragma: no cover - GPU only


class ModelRunner:
    """A loaded causal LM and the calls that run it (see the module docstring)."""

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
        # Attention to cached prefixes without copying them per row (.shared_prefix): the
        # model falls back to the attention above outside a scoring forward that asks for
        # it, so switching it is harmless to a sibling engine over the same model.
        attn = use_shared_prefix_attention(model)
        if where.type == "cpu":
            use_blocked_lm_head(model)  # the vocabulary projection in cache-sized blocks
        if attn not in _DENSE_MASK_ATTENTION:
            raise EngineError(
                f"attention implementation {attn!r} is not supported: the engine needs one "
                f"of {', '.join(_DENSE_MASK_ATTENTION)} (dense 4D attention masks)"
            )
        #: The attention implementation the model runs (one that takes a dense 4D mask).
        self.attention: str = attn
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
        #: Run the model in the event loop's own thread rather than a worker thread: in an
        #: engine process (:mod:`dpicl.engines.process.main`) the loop has nothing else to do
        #: while a batch runs, and a second thread would only contend for the interpreter
        #: lock with the model (requests that arrive meanwhile wait in the pipe and join the
        #: next batch). Never in the server's own process: it would stall HTTP.
        self.inline = False
        #: The dtype of the weights and where they came from (``DPICL_DTYPE``,
        #: ``DPICL_LOAD_FORMAT``), as :meth:`TransformersEngine.load` set them.
        self.dtype: str = str(next(iter(model.parameters())).dtype).removeprefix("torch.")
        self.load_format = "auto"
        # torch's thread pools as the factory set them (DPICL_TORCH_THREADS); None: untouched.
        self.threads: ThreadPlan | None = None
        self._lock = threading.Lock()
        self._calls = itertools.count()
        self._closed = False
        # An unset prefix-cache budget is sized here, with the weights already on the device.
        self.tuning = (tuning if tuning is not None else EngineTuning()).sized_for(
            where.type, _free_device_bytes(where)
        )
        self.prefix_cache = PrefixCache(
            self.tuning.prefix_cache_bytes, self.tuning.prefix_cache_entries
        )
        self.kv_workspace = KVWorkspace(self.tuning.kv_workspace_bytes)
        # False: scoring and generation batches stack cached prefixes in a DynamicCache
        # instead of a SlotCache (the path before; bench/voting.py compares the two).
        self.slot_caches = True
        #: Warm scoring batches attend to each cached prefix where the cache holds it
        #: instead of copying it per row (:mod:`.shared_prefix`; ``DPICL_SHARED_PREFIX``).
        self.shared_prefix_attention = (
            attn == SHARED_PREFIX_ATTENTION
            and self.tuning.shares_prefix_attention(where.type, _kv_width(model.config))
        )
        #: The score batcher launches the next batch before reading the last one back
        #: (:mod:`.batching`, "Overlap"; ``DPICL_ENGINE_OVERLAP``).
        self.overlap = self.tuning.overlaps(where.type)

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

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread under the model lock (:meth:`locked`), or in
        this thread where the runner is :attr:`inline`."""
        if self._closed:
            raise EngineError("the transformers engine is closed")
        if self.inline:
            return self.locked(fn, *args)
        return await asyncio.to_thread(self.locked, fn, *args)

    def locked(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in this thread, under the model lock and ``torch.inference_mode``:
        the model sees one batch at a time."""
        # The batch is a range in a torch.profiler trace (bench/gpu.py --profile counts the
        # synchronisations and launches per batch by it); without a profiler it costs ~1 us.
        with self._lock, torch.inference_mode(), torch.profiler.record_function("dpicl::batch"):
            if self._closed:
                raise EngineError("the transformers engine is closed")
            plan = self.threads
            if plan is not None and torch.get_num_threads() != plan.intra:
                # torch's intra-op count is per thread once a thread has run an operator
                # (OpenMP's): a worker thread that ran one before the plan was set, or
                # before it changed, would keep its old count (bench/threads.py compared
                # 2 threads with 2 that way). Setting it here holds it in every thread.
                torch.set_num_threads(plan.intra)
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

    @functools.cached_property
    def tokens(self) -> PromptTokenizer:
        """Renders and tokenises prompts before they reach the model's thread, each prefix
        once (:class:`~dpicl.engines.prompting.PromptTokenizer`): the engine's own entry
        points use it in the caller's thread; in an engine process the server process has
        its own (sent in :class:`~dpicl.engines.process.wire.EngineInfo`)."""
        return PromptTokenizer.from_encoder(self.encoder)

    def next_call(self) -> str:
        """A fresh marker of one call: the scope of its prompts without a context."""
        return f"call:{next(self._calls)}"

    def row_of(self, enc: EncodedPrompt) -> Row:
        """A batch row of an encoded prompt; its slot is dropped where the prefix cache is
        off (the batch then shares only a common prefix, as without a slot)."""
        slot = enc.slot if self.prefix_cache.enabled else None
        return Row(list(enc.ids), slot, enc.scope, enc.prefix_len if slot else 0)

    def encode_row(self, prompt: PromptSpec, call: str) -> Row:
        """``prompt`` encoded for a batch (:meth:`PromptTokenizer.encode_prompt`); ``call``
        marks the call it came in, the scope of a prompt without a context
        (``PromptSpec.cache_scope``): rows of different scopes never share a prefix
        (:func:`~.past.shared_past`)."""
        return self.row_of(self.tokens.encode_prompt(prompt, call)[0])

    # ------------------------------------------------------------------ batches

    def left_pad(self, seqs: Sequence[Sequence[int]]) -> Batch:
        """``seqs`` left padded on the model's device
        (:func:`~.kv_layout.left_pad`)."""
        return left_pad(seqs, self.pad_token_id, self.device)

    def chunks(self, costs: Sequence[int], widths: Sequence[int]) -> list[list[int]]:
        """Row indices cut into batches of at most ``max_batch_tokens`` (rows x width)."""
        return chunks(costs, widths, self.max_batch_tokens)

    def forward(
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
