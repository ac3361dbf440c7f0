"""Tensor layouts of the transformers engine's batches (pure functions, no model).

* :func:`left_pad`: rows right-aligned with pads in front, ``position_ids`` counting only
  real tokens, so a row's logits do not depend on its batch.
* :func:`stack_prefixes`: per-row cached prefix KV states of different lengths stacked as
  one batch cache, each left padded to the longest (``[pads][prefix]``, pads masked).
* :func:`slot_prefixes`: the same in scratch slots with room after each row for a
  forward's new tokens, written in place (:mod:`.slot_cache`).
* :func:`plan_scoring`: one forward that scores every label of every row. Each row's new
  tokens (``rest``) are followed by the tokens of its multi-token labels, each label a
  branch that sees the row's prefix and rest and its own earlier tokens but not the other
  labels (a 4D "tree" attention mask). The logits of the last rest token give every
  label's first token; those of a branch's tokens give that label's later tokens. Before,
  this took a second forward over copies of the prompts' KV cache; the branches cost the
  same tokens without the second pass over the weights or the cache copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpicl.engines.transformers.attention import SHARED_KV_SDPA
from dpicl.engines.transformers.shared_prefix import SHARED_PREFIX_ATTENTION

__all__ = [
    "Batch",
    "ScoringPlan",
    "attention_mask_for",
    "chunks",
    "common_prefix_len",
    "left_pad",
    "pack_layers",
    "plan_scoring",
    "prefix_mask",
    "slot_prefixes",
    "stack_packed",
    "stack_prefixes",
    "to_device",
]

Layers = Sequence[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class Batch:
    """A left-padded batch."""

    input_ids: torch.Tensor  # (B, S) long
    attention_mask: torch.Tensor  # (B, S) long
    position_ids: torch.Tensor  # (B, S) long
    last_pos: torch.Tensor  # (B,) long: position id of each row's last real token


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        tok = first[i]
        if any(s[i] != tok for s in seqs):
            return i
    return n


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> Batch:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
    return Batch(ids, mask, pos, pos[:, -1].clone())


def chunks(costs: Sequence[int], widths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group row indices (longest first) so that rows x width x cost factor stays within
    ``max_tokens``; a row that alone exceeds it goes alone."""
    order = sorted(range(len(widths)), key=lambda i: -widths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    cur_width = 0
    cur_cost = 0
    for i in order:
        w = max(cur_width, widths[i])
        c = cur_cost + costs[i]
        if cur and w * c > max_tokens:
            out.append(cur)
            cur, w, c = [], widths[i], costs[i]
        cur.append(i)
        cur_width, cur_cost = w, c
    if cur:
        out.append(cur)
    return out


def stack_prefixes(
    found: Sequence[Layers | None], lens: Sequence[int], device: torch.device
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Per layer ``(K, V)`` of shape (B, heads, W, dim), row b's prefix (``found[b]``, of
    ``lens[b]`` tokens; None: no prefix) right-aligned, and the (B, W) mask of real keys."""
    n, width = len(found), max(lens)
    template = next(e for e in found if e is not None)
    layers: list[tuple[torch.Tensor, torch.Tensor]] = []
    for li, (k0, v0) in enumerate(template):
        k = k0.new_zeros((n, k0.shape[1], width, k0.shape[3]))
        v = v0.new_zeros((n, v0.shape[1], width, v0.shape[3]))
        for b, e in enumerate(found):
            if e is not None:
                ke, ve = e[li]
                k[b, :, width - lens[b] :, :] = ke[0]
                v[b, :, width - lens[b] :, :] = ve[0]
        layers.append((k, v))
    return layers, prefix_mask(lens, device)


def pack_layers(
    layers: Layers,
) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...]]:
    """One prefix's per-layer ``(K, V)`` (each (1, heads, n, dim)) copied into one tensor of
    shape (layers, 2, heads, n, dim), and the per-layer views of it."""
    packed = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers])
    return packed, tuple((packed[i, 0][None], packed[i, 1][None]) for i in range(len(layers)))


def stack_packed(
    found: Sequence[torch.Tensor | None], lens: Sequence[int], device: torch.device
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """:func:`stack_prefixes` for prefixes packed by :func:`pack_layers`: one copy per row
    instead of one per row and layer (64 rows of a 30-layer model: 64 copies, not 3,840)."""
    n, width = len(found), max(lens)
    template = next(p for p in found if p is not None)
    n_layers, _, heads, _, dim = template.shape
    out = template.new_zeros((n, n_layers, 2, heads, width, dim))
    for b, p in enumerate(found):
        if p is not None:
            out[b, :, :, :, width - lens[b] :, :] = p
    return [(out[:, i, 0], out[:, i, 1]) for i in range(n_layers)], prefix_mask(lens, device)


def prefix_mask(lens: Sequence[int], device: torch.device) -> torch.Tensor:
    """The (B, W) mask of real keys of prefixes of ``lens`` tokens right-aligned in a width
    of the longest (``[pads][prefix]``)."""
    width = max(lens)
    mask = torch.zeros((len(lens), width), dtype=torch.long)
    for b, p in enumerate(lens):
        if p:
            mask[b, width - p :] = 1
    return mask.to(device)


def slot_prefixes(
    found: Sequence[torch.Tensor | None], lens: Sequence[int], room: int, out: torch.Tensor
) -> torch.Tensor:
    """Packed prefixes (:func:`pack_layers`; None: no prefix, ``lens[b]`` then 0) laid out
    in ``out``, of shape (layers, 2, B, heads, W + ``room``, dim) with W the longest prefix:
    row b's prefix right-aligned in the first W slots (``[pads][prefix]``, one copy per
    row), its pads zeroed (masked keys must stay finite: a masked score is still computed
    before the mask drops it), the last ``room`` slots left for a forward's new tokens
    (:class:`~.slot_cache.SlotCache`). Returns ``out``."""
    width = max(lens)
    if out.shape[2] != len(found) or out.shape[4] != width + room:
        raise ValueError(
            f"slots of shape {tuple(out.shape)} do not fit {len(found)} rows of "
            f"{width} + {room} positions"
        )
    for b, p in enumerate(found):
        pad = width - (lens[b] if p is not None else 0)
        if pad:
            out[:, :, b, :, :pad].zero_()
        if p is not None:
            out[:, :, b, :, pad:width] = p
    return out


@dataclass(frozen=True, slots=True)
class ScoringPlan:
    """Inputs of the one scoring forward and where to read each label's log-probabilities.

    ``keep`` marks the positions whose logits are computed (row-major order, as the model's
    boolean ``logits_to_keep`` returns them); ``reads[b][j]`` lists ``(flat index, token)``
    pairs whose log-probabilities sum to row b's score of label j.

    ``keep_at`` gives the same positions as K per row (a row with fewer repeats its first),
    the integer ``logits_to_keep`` that needs no device read to know its output's size (a
    boolean one does: its count); ``read_at`` is every read of ``reads``, in order, as
    ``(index into the (B x K) rows of those logits, token)`` on the device.
    """

    input_ids: torch.Tensor  # (B, S) long
    position_ids: torch.Tensor  # (B, S) long
    mask: torch.Tensor  # (B, 1, S, W + S) bool: True where a query may attend a key
    keep: torch.Tensor  # (B, S) bool
    reads: list[list[list[tuple[int, int]]]]
    keep_at: torch.Tensor  # (B, K) long
    read_at: torch.Tensor  # (reads, 2) long


def plan_scoring(
    rests: Sequence[Sequence[int]],
    labels: Sequence[Sequence[Sequence[int]]],
    offsets: Sequence[int],
    past_mask: torch.Tensor,
    pad_id: int,
    device: torch.device | None = None,
) -> ScoringPlan:
    """Lay out rows ``rests[b]`` (each non-empty; their position ids start at
    ``offsets[b]``, after a past of keys ``past_mask[b]``) with a branch per multi-token
    label of ``labels[b]``: ``[pads][rest][branch 1][branch 2]...[pads]``. The plan's
    tensors go to ``device`` (default: ``past_mask``'s).

    The token grid is built in Python lists and the mask by whole-batch comparisons of each
    column's segment (pad, rest, branch k), with a constant number of tensor operations
    whatever the batch: row-by-row tensor slicing cost milliseconds of host time per call,
    which on a GPU is a large part of a warm scoring call."""
    n = len(rests)
    r_width = max(len(r) for r in rests)
    branches = [[lab[:-1] for lab in labs if len(lab) > 1] for labs in labels]
    s = r_width + max(sum(len(t) for t in br) for br in branches)
    ids = [[pad_id] * s for _ in range(n)]
    pos = [[0] * s for _ in range(n)]
    seg = [[-1] * s for _ in range(n)]  # -1 pad, 0 the rest, k the k-th branch
    keep = [[False] * s for _ in range(n)]
    reads: list[list[list[tuple[int, int]]]] = []
    kept = 0  # kept positions before this row (the logits' row-major flat index)
    k_max = 1 + max(sum(len(t) for t in br) for br in branches)
    keep_at: list[list[int]] = []
    read_at: list[tuple[int, int]] = []
    for b, (rest, br, labs) in enumerate(zip(rests, branches, labels, strict=True)):
        start, top = r_width - len(rest), offsets[b] + len(rest)
        ids[b][start:r_width] = rest
        pos[b][start:r_width] = range(offsets[b], top)
        seg[b][start:r_width] = [0] * len(rest)
        width = sum(len(t) for t in br)
        keep[b][r_width - 1 : r_width + width] = [True] * (1 + width)
        col = r_width
        for k, toks in enumerate(br, start=1):
            ids[b][col : col + len(toks)] = toks
            pos[b][col : col + len(toks)] = range(top, top + len(toks))
            seg[b][col : col + len(toks)] = [k] * len(toks)
            col += len(toks)
        # Flat indices: the last rest token, then the branches' tokens in column order.
        row: list[list[tuple[int, int]]] = []
        at = kept + 1
        for lab in labs:
            got = [(kept, int(lab[0]))]
            if len(lab) > 1:
                got += [(at + i, int(t)) for i, t in enumerate(lab[1:])]
                at += len(lab) - 1
            row.append(got)
        reads.append(row)
        # The same reads in the (B x K) rows of integer-kept logits: row b's j-th kept
        # position is row b * K + j there.
        keep_at.append(
            list(range(r_width - 1, r_width + width)) + [r_width - 1] * (k_max - 1 - width)
        )
        read_at += [(b * k_max + i - kept, t) for got in row for i, t in got]
        kept = at
    segment = torch.tensor(seg, dtype=torch.long)
    real = segment >= 0
    col_ix = torch.arange(s)
    causal = col_ix[None, :] <= col_ix[:, None]  # (S, S): key column <= query column
    query, key = segment[:, :, None], segment[:, None, :]
    # A rest token sees the rest before it; a branch token the whole rest and its own
    # branch up to itself; nobody sees a pad or another branch.
    att = (key == 0) & ((query > 0) | causal) | (query > 0) & (query == key) & causal
    att &= real[:, :, None] & real[:, None, :]
    # A pad query attends to itself only (an all-masked row would give NaN).
    att |= torch.diag_embed(~real)
    w = past_mask.shape[1]
    # The past's mask is read on the host: a device copy would be a synchronisation per
    # batch on CUDA (the host waiting for the device before it can lay out the next
    # forward), so callers pass it built on the host (prefix_mask(offsets)) and ``device``.
    dev = past_mask.device if device is None else device
    past = past_mask.bool().cpu()[:, None, :].expand(n, s, w) & real[:, :, None]
    mask = torch.cat([past, att], dim=2)[:, None, :, :]
    return ScoringPlan(
        to_device(torch.tensor(ids, dtype=torch.long), dev),
        to_device(torch.tensor(pos, dtype=torch.long), dev),
        to_device(mask, dev),
        to_device(torch.tensor(keep, dtype=torch.bool), dev),
        reads,
        to_device(torch.tensor(keep_at, dtype=torch.long), dev),
        to_device(torch.tensor(read_at, dtype=torch.long), dev),
    )


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: on CUDA from pinned memory without waiting (the copy is
    ordered on the stream before the kernels that read it, so the host goes on laying out
    the batch while it runs); elsewhere as it is."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)  # pragma: no cover - GPU only


def attention_mask_for(mask: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """A boolean 4D mask (True: attend) in the form ``implementation`` takes: as it is for
    ``sdpa`` and :data:`~.attention.SHARED_KV_SDPA`; additive (0 where attended,
    the dtype's minimum elsewhere) for ``eager``."""
    if implementation in ("sdpa", SHARED_KV_SDPA, SHARED_PREFIX_ATTENTION):
        return mask
    if implementation == "eager":
        out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return out.masked_fill(~mask, torch.finfo(dtype).min)
    raise ValueError(f"attention implementation {implementation!r} takes no dense 4D mask")
