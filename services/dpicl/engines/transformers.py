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

Batching across requests (:mod:`dpicl.engines.batching`). Concurrent ``score_labels``
calls that arrive together are merged into one batch (each row keeps its own labels and
prefix) and each call gets back exactly its own rows. A call whose prompts fail to encode
(too long) fails alone.

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
import numpy.typing as npt
import torch

from dpicl.engines.base import (
    FloatArray,
    GenerationParams,
    PromptSpec,
    StepLogits,
)
from dpicl.engines.batching import MicroBatcher
from dpicl.engines.prefix_cache import PrefixCache, PrefixEntry, prefix_fingerprint
from dpicl.engines.tuning import EngineTuning
from dpicl.errors import DpiclError, EngineError, InvalidRequest

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
class _Row:
    """One encoded prompt: the model's text, its token ids and, when its prefix may be
    cached, the cache key ``(cache_key, fingerprint)`` and the rendered prefix text."""

    rendered: str
    ids: list[int]
    slot: tuple[str, str] | None = None
    rendered_prefix: str = ""


_ScoreJob = tuple[list[PromptSpec], list[str]]


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
        tuning: EngineTuning | None = None,
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
        self.tuning = tuning if tuning is not None else EngineTuning()
        self.prefix_cache = PrefixCache(
            self.tuning.prefix_cache_bytes, self.tuning.prefix_cache_entries
        )
        self.score_batcher: MicroBatcher[_ScoreJob, FloatArray] = MicroBatcher(
            self._run_score_jobs,
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

    def _encode_row(self, prompt: PromptSpec) -> _Row:
        rendered, ids = self.encode(prompt)
        prefix = prompt.prefix_text
        if not (prompt.cache_key and prefix and self.prefix_cache.enabled):
            return _Row(rendered, ids)
        # Where the prompt text sits inside the chat template (the template copies it
        # verbatim; if it did not, the row is simply not cached).
        at = rendered.find(prompt.text)
        if at < 0:
            return _Row(rendered, ids)
        head = rendered[: at + len(prefix)]
        return _Row(rendered, ids, (prompt.cache_key, prefix_fingerprint(head)), head)

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

    def _prefill_rows(self, rows: Sequence[_Row], *, use_cache: bool) -> _Prefill:
        """:meth:`_prefill` over encoded rows, on top of their cached prefixes if any."""
        if not any(r.slot is not None for r in rows):
            return self._prefill([r.ids for r in rows], use_cache=use_cache)
        entries = self._prefix_entries(rows)
        if not entries:
            return self._prefill([r.ids for r in rows], use_cache=use_cache)
        found = [entries.get(r.slot) if r.slot is not None else None for r in rows]
        found = [
            e if e is not None and e.matches(r.ids) else None
            for e, r in zip(found, rows, strict=True)
        ]
        if not any(e is not None for e in found):
            return self._prefill([r.ids for r in rows], use_cache=use_cache)
        return self._prefill_on_prefixes(rows, found)

    def _prefix_entries(self, rows: Sequence[_Row]) -> dict[tuple[str, str], PrefixEntry]:
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
            own = self._encode_text(r.rendered_prefix, special=not self.use_chat_template)
            n = _common_prefix_len([own, r.ids])
            # Leave the prefix's last token to the query side: it is the one a tokeniser
            # may merge with the query's first characters.
            n = min(n, len(own) - 1, len(r.ids) - 1)
            if n >= 1:
                todo[r.slot] = r.ids[:n]
        if todo:
            keys = list(todo)
            pre = self._prefill([todo[k] for k in keys], use_cache=True)
            kv = [(k, v) for k, v, *_ in pre.res.past_key_values]
            for b, key in enumerate(keys):
                real = pre.attention_mask[b].nonzero()[:, 0]
                layers = tuple(
                    (
                        k[b : b + 1].index_select(2, real).contiguous(),
                        v[b : b + 1].index_select(2, real).contiguous(),
                    )
                    for k, v in kv
                )
                entry = PrefixEntry(tuple(todo[key]), layers)
                self.prefix_cache.put(key, entry)
                have[key] = entry
            del pre, kv
        return have

    def _prefill_on_prefixes(
        self, rows: Sequence[_Row], found: Sequence[PrefixEntry | None]
    ) -> _Prefill:
        """One forward over each row's tokens after its cached prefix (``found[b]``; None:
        the whole row). Layout per row: ``[pads][prefix][pads][rest]``, pads masked."""
        from transformers import DynamicCache

        n = len(rows)
        lens = [len(e.ids) if e is not None else 0 for e in found]
        width = max(lens)
        template = next(e for e in found if e is not None).layers
        pmask = torch.zeros((n, width), dtype=torch.long, device=self.device)
        layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        for li, (k0, v0) in enumerate(template):
            k = k0.new_zeros((n, k0.shape[1], width, k0.shape[3]))
            v = v0.new_zeros((n, v0.shape[1], width, v0.shape[3]))
            for b, e in enumerate(found):
                if e is not None:
                    ke, ve = e.layers[li]
                    k[b, :, width - lens[b] :, :] = ke[0]
                    v[b, :, width - lens[b] :, :] = ve[0]
            layers.append((k, v))
        for b, p in enumerate(lens):
            if p:
                pmask[b, width - p :] = 1
        rest = self._left_pad([r.ids[p:] for r, p in zip(rows, lens, strict=True)])
        offset = torch.tensor(lens, dtype=torch.long, device=self.device)
        attn = torch.cat([pmask, rest.attention_mask], dim=1)
        res = self._forward(
            rest.input_ids,
            attn,
            rest.position_ids + offset[:, None],
            past=DynamicCache(ddp_cache_data=layers),
            use_cache=True,
            last_only=True,
        )
        return _Prefill(res, attn, rest.last_pos + offset)

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
        job: _ScoreJob = (list(prompts), list(labels))
        return await self.score_batcher.submit(job, size=len(job[0]))

    async def _run_score_jobs(self, jobs: list[_ScoreJob]) -> list[FloatArray | BaseException]:
        return await self._run(self._score_jobs_sync, jobs)

    def _score_jobs_sync(self, jobs: list[_ScoreJob]) -> list[FloatArray | BaseException]:
        """Score several calls' prompts as one batch; one result (or error) per call."""
        results: list[FloatArray | BaseException] = []
        rows: list[_Row] = []
        lab_ids: list[list[list[int]]] = []
        outs: list[npt.NDArray[np.float64]] = []
        for prompts, labels in jobs:
            try:
                enc = [self._encode_row(p) for p in prompts]
                labs = [[self.label_ids(r.rendered, lab) for lab in labels] for r in enc]
            except DpiclError as exc:
                results.append(exc)
                continue
            out = np.empty((len(prompts), len(labels)), dtype=np.float64)
            results.append(out)
            rows.extend(enc)
            lab_ids.extend(labs)
            outs.extend(out[i] for i in range(len(prompts)))
        if not rows:
            return results
        widths = [len(r.ids) for r in rows]
        # A prompt with m multi-token labels costs (1 + m) cache rows in the second pass.
        costs = [1 + sum(len(x) > 1 for x in row) for row in lab_ids]
        try:
            for chunk in self._chunks(costs, widths):
                self._score_chunk(
                    [rows[i] for i in chunk], [lab_ids[i] for i in chunk], [outs[i] for i in chunk]
                )
        except Exception as exc:  # the model failed: every call of the batch fails
            return [r if isinstance(r, BaseException) else exc for r in results]
        return results

    def _score_chunk(
        self,
        rows: list[_Row],
        lab_ids: list[list[list[int]]],
        outs: list[npt.NDArray[np.float64]],
    ) -> None:
        """Fill ``outs[b][j]`` with the log-probability of label j's tokens after row b."""
        multi = any(len(x) > 1 for labs in lab_ids for x in labs)
        pre = self._prefill_rows(rows, use_cache=multi)
        res = pre.res
        last = res.logits[:, -1, :].float()  # (B, V)
        logp = last - torch.logsumexp(last, dim=-1, keepdim=True)
        flat_b = [b for b, labs in enumerate(lab_ids) for _ in labs]
        flat_t = [ids[0] for labs in lab_ids for ids in labs]
        first = logp[
            torch.tensor(flat_b, dtype=torch.long, device=last.device),
            torch.tensor(flat_t, dtype=torch.long, device=last.device),
        ]
        first_lp = first.double().cpu().numpy()
        at = 0
        for b, labs in enumerate(lab_ids):
            outs[b][:] = first_lp[at : at + len(labs)]
            at += len(labs)
        pairs = [
            (b, j) for b, labs in enumerate(lab_ids) for j, ids in enumerate(labs) if len(ids) > 1
        ]
        if not pairs:
            return
        # Second pass: every multi-token label's remaining tokens, all (prompt, label)
        # pairs as one batch over copies of the prompts' KV cache.
        cache = res.past_key_values
        src = torch.tensor([b for b, _ in pairs], dtype=torch.long, device=self.device)
        cache.reorder_cache(src)
        conts = [lab_ids[b][j] for b, j in pairs]
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
            outs[b][j] += float(lp.double().sum().item())
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
        encoded = [self._encode_row(p) for p in prompts]
        widths = [len(r.ids) + params.max_tokens for r in encoded]
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
        self, rows: list[_Row], params: GenerationParams, gen: torch.Generator
    ) -> list[str]:
        n = len(rows)
        pre = self._prefill_rows(rows, use_cache=True)
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
