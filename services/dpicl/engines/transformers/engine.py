"""The Hugging Face transformers engine: in-process, CPU or CUDA.

Every model call runs in a worker thread (:func:`asyncio.to_thread`) under one lock, so the
event loop stays free and the model sees one batch at a time. Batches are left padded with
explicit ``position_ids`` (``attention_mask.cumsum(-1) - 1``, clamped at 0), so a prompt's
logits do not depend on what it was batched with (up to float rounding, tested to 1e-4).
The tensor layouts are in :mod:`.kv_layout`.

Prompts and labels are rendered and tokenised before they reach the model's thread (issue
46): by the caller here (:attr:`~.runner.ModelRunner.tokens`), by the server process where
the engine runs in a process of its own (which sends ``score_encoded`` and
``generate_encoded`` token ids), each prefix once, with :class:`~dpicl.engines.prompting.
PromptTokenizer`, which gives the ids :class:`~dpicl.engines.prompting.PromptEncoder` gives
(the convention the vLLM engine shares; its docstring has the rules): with a
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

Per-context prefix reuse (:mod:`.prefix_cache`). A prompt whose
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
branch per multi-token label (:func:`~.kv_layout.plan_scoring`: a 4D attention
mask keeps the branches apart), with logits computed only where a label token is read.

Batching across requests (:mod:`.batching`). Concurrent ``score_labels``
calls that arrive together are merged into one batch (each row keeps its own labels and
prefix) and each call gets back exactly its own rows. A call whose prompts fail to encode
(too long) fails alone. Concurrent ``generate`` calls with the same settings are merged the
same way; each call samples from its own seeded generator, so its text does not depend on
what it was batched with (up to float rounding).

The model, its tokenizer and device, the model lock and the forward and batching calls:
:mod:`.runner` (the engine is a runner; the helpers below take one). The past
a batch continues from (shared prefix, cached prefixes stacked or in a slot cache)
and the forwards that build it: :mod:`.past`. Label scoring:
:mod:`.scoring`. Free-text generation:
:mod:`.generation`. DPS-MOZO decoding:
:mod:`.decoding`.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpicl.engines.base import FloatArray, GenerationParams, PromptSpec
from dpicl.engines.placement import resolve_dtype
from dpicl.engines.prompting import EncodedPrompt
from dpicl.engines.transformers.batching import MicroBatcher
from dpicl.engines.transformers.decoding import TransformersDecodingSession
from dpicl.engines.transformers.generation import GenJob, generate_jobs
from dpicl.engines.transformers.runner import DEFAULT_MAX_BATCH_TOKENS, ModelRunner
from dpicl.engines.transformers.scoring import ScoreJob, launch_score_jobs, score_jobs
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import EngineError, InvalidRequest

__all__ = ["DEFAULT_MAX_BATCH_TOKENS", "TransformersDecodingSession", "TransformersEngine"]

log = logging.getLogger(__name__)


class TransformersEngine(ModelRunner):
    """An :class:`~dpicl.engines.base.Engine` backed by a transformers causal LM: a
    :class:`~.runner.ModelRunner` with the micro-batchers and sessions."""

    name: str = "transformers"
    is_simulator: bool = False

    # The micro-batchers are made on first use: the runner's constructor is the engine's.
    @functools.cached_property
    def score_batcher(self) -> MicroBatcher[ScoreJob, FloatArray]:
        return MicroBatcher(
            self._run_score_jobs,
            max_wait_s=self.tuning.batch_wait_ms / 1000,
            max_size=self.tuning.batch_max_prompts,
            name="score",
            launch=self._launch_score_jobs if self.overlap else None,
        )

    @functools.cached_property
    def generate_batcher(self) -> MicroBatcher[GenJob, list[str]]:
        return MicroBatcher(
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
        dtype: str = "auto",
        load_format: str = "auto",
        model_name: str | None = None,
        share_prefix: bool = True,
        tuning: EngineTuning | None = None,
    ) -> TransformersEngine:
        """Load a model directory (or a hub name available offline). Blocking: call it
        before the event loop starts serving, or through :func:`asyncio.to_thread`.

        ``dtype`` (``DPICL_DTYPE``; :func:`~dpicl.engines.placement.resolve_dtype`): the
        weights load straight onto ``device`` in it, with no float32 copy in host memory.
        ``load_format="dummy"`` (``DPICL_LOAD_FORMAT``) builds the model from the
        directory's ``config.json`` with random weights, on the device.

        torch's thread pools are process-wide: :func:`dpicl.engines.threads.apply_torch_threads`
        sets them (the factory does, from ``DPICL_TORCH_THREADS``).
        """
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(f"device {device!r} was asked for but CUDA is not available")
        if load_format not in ("auto", "dummy"):
            raise EngineError(f"unknown load format {load_format!r}; expected auto or dummy")
        bf16 = dev.type != "cuda" or torch.cuda.is_bf16_supported()
        try:
            dtype_name = resolve_dtype(dtype, dev.type, bf16_supported=bf16)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        torch_dtype = getattr(torch, dtype_name)
        src = str(model_path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(src)
            if load_format == "dummy":
                config = AutoConfig.from_pretrained(src)
                # Built where it runs: 16 GB of random bfloat16 initialised on the GPU, not
                # 32 GB of float32 in host memory first.
                with dev:
                    model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                        config, dtype=torch_dtype
                    )
            elif dev.type == "cpu":
                model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype)
            else:
                # accelerate's device map writes each tensor straight onto the device.
                model = AutoModelForCausalLM.from_pretrained(
                    src, dtype=torch_dtype, device_map={"": str(dev)}
                )
        except (OSError, ValueError) as exc:
            raise EngineError(f"cannot load the model {src!r}: {exc}") from exc
        model.to(dev)
        model.eval()
        tokenizer.padding_side = "left"
        name = model_name or (Path(src).name if Path(src).is_dir() else src)
        engine = cls(
            model,
            tokenizer,
            model_name=name,
            device=str(dev),
            max_batch_tokens=max_batch_tokens,
            use_chat_template=use_chat_template,
            share_prefix=share_prefix,
            tuning=tuning,
        )
        engine.load_format = load_format
        if load_format == "dummy":
            log.warning(
                "DPICL_LOAD_FORMAT=dummy: %s has RANDOM weights (capacity planning only); "
                "its answers mean nothing",
                name,
            )
        return engine

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
        # Tokenised here, in the caller's thread, not in the batch (issue 46): a prompt
        # that does not fit fails its own call before it reaches the batcher.
        rows, labs = self.tokens.encode_scoring(prompts, labels, self.next_call())
        return await self.score_encoded(rows, labs)

    async def score_encoded(
        self, rows: Sequence[EncodedPrompt], labels: Sequence[Sequence[Sequence[int]]]
    ) -> FloatArray:
        """:meth:`score_labels` of prompts already tokenised (``labels[b][j]``: label j's
        token ids after row b): what the engine process runs for the server process."""
        if self._closed:
            raise EngineError("the transformers engine is closed")
        if not rows:
            return np.zeros((0, len(labels[0]) if labels else 0), dtype=np.float64)
        job: ScoreJob = (list(rows), [[list(x) for x in row] for row in labels])
        return await self.score_batcher.submit(job, size=len(job[0]))

    async def _run_score_jobs(self, jobs: list[ScoreJob]) -> list[FloatArray | BaseException]:
        return await self.run(score_jobs, self, jobs)

    async def _launch_score_jobs(
        self, jobs: list[ScoreJob]
    ) -> Callable[[], Awaitable[list[FloatArray | BaseException]]]:
        """Launch a scoring batch (the micro-batcher's overlap); the returned function
        reads its results back."""
        pending = await self.run(launch_score_jobs, self, jobs)
        return functools.partial(self.run, pending.collect)

    # ------------------------------------------------------------------ generation

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        params.check()
        if not prompts:
            return []
        if self._closed:
            raise EngineError("the transformers engine is closed")
        rows = self.tokens.encode_generation(prompts, self.next_call())
        return await self.generate_encoded(rows, params)

    async def generate_encoded(
        self, rows: Sequence[EncodedPrompt], params: GenerationParams
    ) -> list[str]:
        """:meth:`generate` of prompts already tokenised."""
        params.check()
        if not rows:
            return []
        if self._closed:
            raise EngineError("the transformers engine is closed")
        job: GenJob = (list(rows), params)
        return await self.generate_batcher.submit(job, size=len(job[0]))

    async def _run_generate_jobs(self, jobs: list[GenJob]) -> list[list[str] | BaseException]:
        return await self.run(generate_jobs, self, jobs)

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
        await self.run(session._start_sync)
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

        await asyncio.to_thread(self.locked, _release)
