"""The protocols every engine and embedder implements.

Pipelines build :class:`PromptSpec` objects (rendered text plus the structure it was
rendered from) and hand a whole query's worth of them to the engine at once: the T
partition prompts of a voting or ESA query are one batch, the T_cand zero-shot
candidates another. Engines never see privacy parameters and never draw DP noise.

Three capabilities cover the three mechanisms:

* ``score_labels``: log-likelihood of each label's tokens after each prompt (voting).
  Labels are scored, never parsed from free text (DESIGN.md section 3).
* ``generate``: free-text generation (ESA partition outputs and zero-shot candidates).
* ``open_decoding``: a stepwise decoding session over several prompts that share the
  generated suffix (DPS-MOZO): each step returns the zero-shot row's top-k token ids and
  every prompt's logits at those ids; the caller picks the next token outside the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from dpicl.errors import EngineError, InvalidRequest

__all__ = [
    "DecodingSession",
    "Embedder",
    "Engine",
    "EngineError",
    "Exemplar",
    "GenerationParams",
    "PromptSpec",
    "StepLogits",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Exemplar:
    """One private demonstration."""

    input: str
    output: str


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """A prompt as rendered text, plus the structure it came from.

    Real engines read only ``text``. The oracle simulator reads the structure
    (``instructions`` is the template with its slots removed, i.e. the text the provider or
    the auditor wrote around the exemplars and the query).

    Prefix reuse (optional; an engine may ignore both fields). ``text[:prefix_chars]`` is
    the part of the prompt that does not depend on the query (instructions and exemplars up
    to the query slot). ``cache_key`` names the place that prefix comes from (a context and
    one of its partitions) and is set only by the server's pipelines: an engine may keep the
    prefix's KV state under ``cache_key`` (plus a fingerprint of the prefix) and must never
    reuse it for a prompt with another key, so no state is shared across contexts.
    """

    text: str
    query: str
    exemplars: tuple[Exemplar, ...] = ()
    instructions: str = ""
    prefix_chars: int = 0
    cache_key: str | None = None
    # Who may share this prompt's prefix-cache entries: the server sets the context id here
    # (never a client value); an engine with a prefix cache salts it per scope, so one
    # context's cached exemplars cannot be probed by timing from another (DESIGN.md 3).
    cache_scope: str = ""
    # The prompt to run instead when this one does not fit the model (an engine without a
    # length limit never uses it). The pipelines set it on every prompt that holds private
    # exemplars to the public zero-shot prompt of the same query: whether a private prompt
    # fits is a deterministic function of the exemplars, so refusing it (a 4xx, refunded)
    # would release that function un-noised and free of charge. Answering that partition
    # (or DPS-MOZO shot) from the zero-shot prompt keeps its output a function of its own
    # exemplars and the query only, which is all the sensitivity arguments need (paper 000,
    # Algorithm 2: one partition's vote; paper 004, Algorithm 1: a shot equal to p0).
    fallback: PromptSpec | None = None

    @property
    def prefix_text(self) -> str:
        """The query-independent start of ``text`` (empty when none is marked)."""
        return self.text[: self.prefix_chars]


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """Sampling settings for free-text generation.

    ``seed`` seeds the engine's sampler. It is never DP noise (DESIGN.md section 4); the
    pipelines pass a fresh value from OS entropy per request.
    """

    max_tokens: int = 64
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())

    def check(self) -> None:
        """Raise :class:`~dpicl.errors.InvalidRequest` naming the first bad setting; every
        engine calls this before it generates."""
        if self.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1", param="max_tokens")
        if self.temperature < 0:
            raise InvalidRequest("temperature must be >= 0", param="temperature")


@dataclass(frozen=True, slots=True)
class StepLogits:
    """One decoding step of a :class:`DecodingSession`.

    ``top_ids`` are the top-k token ids of the zero-shot prompt's next-token logits;
    ``logits`` has one row per prompt of the session (in the order they were opened) and
    one column per id in ``top_ids``: raw (unnormalised) logits at those ids.
    """

    top_ids: IntArray
    logits: FloatArray


@runtime_checkable
class DecodingSession(Protocol):
    """Stepwise decoding over prompts that share the generated suffix."""

    eos_token_id: int

    async def step(self) -> StepLogits:
        """Logits at the zero-shot top-k ids for every prompt, given the suffix so far."""
        ...

    async def advance(self, token_id: int) -> None:
        """Append ``token_id`` to every prompt's suffix (one batched forward, KV-cached)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenise the generated suffix."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Engine(Protocol):
    """An LLM backend. Implementations: transformers, oracle (simulator), vLLM."""

    name: str
    model: str
    is_simulator: bool

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        """Return an array of shape (len(prompts), len(labels)).

        Entry (i, j) is the total log-probability of label j's tokens as the model's answer
        to prompt i. All prompts go to the model as one batch (or a few, if memory says so).
        """
        ...

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        """One completion per prompt, batched."""
        ...

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> DecodingSession:
        """Start a DPS-MOZO decoding session; ``prompts[zero_shot_index]`` is the zero-shot one."""
        ...

    async def aclose(self) -> None:
        """Release the model."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """A sentence embedder. Rows are unit-norm (ESA's sensitivity bound needs it)."""

    name: str
    dim: int

    async def embed(self, texts: Sequence[str]) -> FloatArray:
        """Return an array of shape (len(texts), dim) with unit L2-norm rows, batched."""
        ...
