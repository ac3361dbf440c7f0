"""The KV state a transformers-engine batch continues from, and the forwards that build it.

Every entry point (label scoring, generation, DPS-MOZO decoding) runs its rows on top of a
past:

* none, or the rows' common token prefix encoded once and copied to every row
  (:func:`shared_past`, at least ``MIN_SHARED_PREFIX`` tokens, only among rows of one
  scope: a context, or one call for prompts without a scope);
* each row's cached per-context prefix (:func:`found_prefixes`; missing ones are encoded in
  one batch by :func:`prefix_entries` and stored in the engine's
  :class:`~.prefix_cache.PrefixCache`), either stacked in a ``DynamicCache``
  (:func:`rows_past`) or laid out once in a :class:`~.slot_cache.SlotCache` in
  the engine's reused workspace with room for the tokens still to come (:func:`slot_past`).

:func:`prefill` and :func:`prefill_rows` run the forward over each row's tokens after its
past. The tensor layouts are in :mod:`.kv_layout`. These functions run under
the engine's model lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpicl.engines.transformers.kv_layout import (
    common_prefix_len,
    pack_layers,
    prefix_mask,
    slot_prefixes,
    stack_packed,
    stack_prefixes,
)
from dpicl.engines.transformers.prefix_cache import PrefixEntry, prefix_lens
from dpicl.engines.transformers.runner import ModelRunner, Row
from dpicl.engines.transformers.slot_cache import SlotCache

__all__ = [
    "MIN_SHARED_PREFIX",
    "Past",
    "Prefill",
    "found_prefixes",
    "prefill",
    "prefill_on",
    "prefill_rows",
    "prefix_entries",
    "rows_past",
    "shared_past",
    "slot_past",
    "slottable",
    "suffix_past",
]

MIN_SHARED_PREFIX = 8


@dataclass(frozen=True, slots=True)
class Past:
    """The KV state a batch's rows continue from: row b's tokens before ``offsets[b]``."""

    cache: Any  # a transformers Cache, or None when there is no past
    mask: torch.Tensor  # (B, W) long: which cached positions are real
    offsets: list[int]


@dataclass(frozen=True, slots=True)
class Prefill:
    """The result of encoding a batch of prompts."""

    res: Any  # the model output: .logits (B, 1, V) unless encoded without, .past_key_values
    attention_mask: torch.Tensor  # (B, S) long, over everything in the cache
    last_pos: torch.Tensor  # (B,) long: position id of each row's last token


def shared_past(engine: ModelRunner, seqs: Sequence[Sequence[int]], scopes: Sequence[str]) -> Past:
    """The rows' common token prefix encoded once and copied to every row, when it is
    at least ``MIN_SHARED_PREFIX`` tokens (and leaves every row a token) and every row has
    the same scope; else none.

    Never across scopes: the micro-batchers merge the calls of concurrent requests, so a
    batch may hold several contexts' prompts. A prefix shared between them is KV state
    shared across contexts, which DESIGN.md section 3 forbids for the same reason as a
    shared prefix cache: how long the common prefix is (how far another context's
    exemplars agree with this one's) shows in every co-batched request's latency, and the
    encoded state of one context would be computed with (and cached from) another's.
    """
    n = len(seqs)
    if len(scopes) != n:
        raise ValueError(f"{len(scopes)} scopes for {n} rows")
    shared = common_prefix_len(seqs) if n > 1 and len(set(scopes)) == 1 else 0
    shared = min(shared, min(len(s) for s in seqs) - 1)
    if shared < MIN_SHARED_PREFIX or not engine.share_prefix:
        return Past(None, torch.zeros((n, 0), dtype=torch.long, device=engine.device), [0] * n)
    prefix = torch.tensor([list(seqs[0][:shared])], dtype=torch.long, device=engine.device)
    ones = torch.ones((1, shared), dtype=torch.long, device=engine.device)
    res0 = engine.forward(
        prefix,
        ones,
        torch.arange(shared, device=engine.device)[None, :],
        use_cache=True,
        logits=False,
    )
    cache = res0.past_key_values
    cache.batch_repeat_interleave(n)
    return Past(cache, ones.expand(n, shared), [shared] * n)


def found_prefixes(engine: ModelRunner, rows: Sequence[Row]) -> list[PrefixEntry | None]:
    """Each row's cached prefix (encoded now when missing), or None: the row has no
    cache slot, or its tokens do not start with the entry's."""
    if not any(r.slot is not None for r in rows):
        return [None] * len(rows)
    entries = prefix_entries(engine, rows)
    found = [entries.get(r.slot) if r.slot is not None else None for r in rows]
    return [
        e if e is not None and e.matches(r.ids) else None for e, r in zip(found, rows, strict=True)
    ]


def rows_past(
    engine: ModelRunner,
    rows: Sequence[Row],
    found: Sequence[PrefixEntry | None],
) -> Past:
    """The rows' cached prefixes (``found``: as :func:`found_prefixes` gives them)
    stacked (``[pads][prefix]``) when any row has one, else :func:`shared_past`."""
    if any(e is not None for e in found):
        from transformers import DynamicCache

        lens = prefix_lens(found)
        if all(e is None or e.packed is not None for e in found):
            layers, mask = stack_packed(
                [e.packed if e is not None else None for e in found], lens, engine.device
            )
        else:
            layers, mask = stack_prefixes(
                [e.layers if e is not None else None for e in found], lens, engine.device
            )
        return Past(DynamicCache(ddp_cache_data=layers), mask, lens)
    return shared_past(engine, [r.ids for r in rows], [r.scope for r in rows])


def prefill_on(
    engine: ModelRunner,
    seqs: Sequence[Sequence[int]],
    past: Past,
    *,
    use_cache: bool,
    logits: bool = True,
) -> Prefill:
    """One forward over each row's tokens after its past (logits of the last only, or
    none with ``logits=False``)."""
    rest = engine.left_pad([s[o:] for s, o in zip(seqs, past.offsets, strict=True)])
    offset = torch.tensor(past.offsets, dtype=torch.long, device=engine.device)
    attn = torch.cat([past.mask, rest.attention_mask], dim=1)
    res = engine.forward(
        rest.input_ids,
        attn,
        rest.position_ids + offset[:, None],
        past=past.cache,
        use_cache=use_cache or past.cache is not None,
        last_only=True,
        logits=logits,
    )
    return Prefill(res, attn, rest.last_pos + offset)


def prefill(
    engine: ModelRunner,
    seqs: Sequence[Sequence[int]],
    *,
    scopes: Sequence[str],
    use_cache: bool,
    logits: bool = True,
) -> Prefill:
    """One forward over ``seqs`` on their shared prefix (see :func:`shared_past`)."""
    past = shared_past(engine, seqs, scopes)
    return prefill_on(engine, seqs, past, use_cache=use_cache, logits=logits)


def slottable(engine: ModelRunner, found: Sequence[PrefixEntry | None]) -> bool:
    """Whether :func:`slot_past` can lay out these rows' cached prefixes: some row has
    one, every one is packed, and slot caches are on."""
    return (
        engine.slot_caches
        and any(e is not None for e in found)
        and all(e is None or e.packed is not None for e in found)
    )


def slot_past(engine: ModelRunner, found: Sequence[PrefixEntry | None], room: int) -> Past:
    """The rows' cached prefixes (``found``, :func:`slottable`) laid out in a
    :class:`~.slot_cache.SlotCache` with ``room`` slots after them, in the
    engine's workspace: valid only until the workspace's next use, so only for a cache
    that dies with the current engine call."""
    packs = [e.packed if e is not None else None for e in found]
    lens = prefix_lens(found)
    template = next(p for p in packs if p is not None)
    n_layers, _, heads, _, dim = template.shape
    shape = (n_layers, 2, len(found), heads, max(lens) + room, dim)
    slots = slot_prefixes(packs, lens, room, engine.kv_workspace.take(shape, template))
    return Past(SlotCache(slots, max(lens)), prefix_mask(lens, engine.device), lens)


def suffix_past(
    engine: ModelRunner, template: torch.Tensor, lens: Sequence[int], room: int
) -> Past:
    """An empty :class:`~.slot_cache.SlotCache` in the engine's workspace with ``room`` slots
    per row, for a forward whose rows attend to their cached prefixes where the cache holds
    them (:mod:`.shared_prefix`): only the new tokens' keys and values go in it. Its
    ``offsets`` are the prefixes' lengths ``lens`` (where each row's positions continue);
    ``template`` is one of those prefixes (:func:`~.kv_layout.pack_layers`' layout)."""
    n_layers, _, heads, _, dim = template.shape
    shape = (n_layers, 2, len(lens), heads, room, dim)
    slots = engine.kv_workspace.take(shape, template)
    mask = torch.zeros((len(lens), 0), dtype=torch.long, device=engine.device)
    return Past(SlotCache(slots, 0), mask, list(lens))


def prefill_rows(engine: ModelRunner, rows: Sequence[Row], *, decode_steps: int) -> Prefill:
    """:func:`prefill` over encoded rows, on top of their cached prefixes if any, with
    the cache kept for ``decode_steps`` more tokens per row (in the engine's workspace
    when the prefixes are cached: for decoding within the current engine call only)."""
    found = found_prefixes(engine, rows)
    if slottable(engine, found):
        lens = prefix_lens(found)
        width = max(len(r.ids) - n for r, n in zip(rows, lens, strict=True))
        past = slot_past(engine, found, width + decode_steps)
    else:
        past = rows_past(engine, rows, found)
    return prefill_on(engine, [r.ids for r in rows], past, use_cache=True)


def prefix_entries(engine: ModelRunner, rows: Sequence[Row]) -> dict[tuple[str, str], PrefixEntry]:
    """The cache entries for the rows' prefixes; missing ones are encoded (one batch)
    and stored. The returned dict keeps them alive for this batch even if evicted."""
    have: dict[tuple[str, str], PrefixEntry] = {}
    todo: dict[tuple[str, str], list[int]] = {}
    scope: dict[tuple[str, str], str] = {}
    for r in rows:
        if r.slot is None or r.slot in have or r.slot in todo:
            continue
        entry = engine.prefix_cache.get(r.slot)
        if entry is not None:
            have[r.slot] = entry
            continue
        # Computed where the prompt was tokenised (PromptTokenizer._slot): the prefix's
        # own tokens less the last, which a tokeniser may merge with the query's first
        # characters.
        n = min(r.prefix_len, len(r.ids) - 1)
        if n >= 1:
            todo[r.slot] = r.ids[:n]
            scope[r.slot] = r.scope
    # In batches of at most max_batch_tokens: a scoring chunk sized for rows that attend
    # to their prefixes in place (.shared_prefix) counts only their new tokens.
    waiting = list(todo)
    for cut in engine.chunks([1] * len(waiting), [len(todo[k]) for k in waiting]):
        keys = [waiting[i] for i in cut]
        pre = prefill(
            engine,
            [todo[k] for k in keys],
            scopes=[scope[k] for k in keys],
            use_cache=True,
            logits=False,
        )
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
            engine.prefix_cache.put(key, entry)
            have[key] = entry
        del pre, kv
    return have
