"""Attention to a cached prefix shared by several rows, without copying it per row (issue 46,
item 3).

A warm scoring batch continues every row from its partition's cached prefix. The slot layout
(:func:`~.kv_layout.slot_prefixes`) copies each row's prefix into a batch tensor before the
forward: at 64 queries in flight on a ten-partition context that is 640 copies of ten
distinct prefixes, and with eight demonstrations per partition (about 400 prefix tokens) the
copy costs more than the new tokens. Here the rows of one prefix are consecutive in the
batch and every layer attends in two parts:

* the rows' queries against their group's prefix keys and values, read straight from the
  prefix cache's packed tensor (no copy; one attention call per group, with the group's rows
  and grouped query heads folded into the query axis, so the prefix's K/V heads are read
  once for all of them);
* the queries against the batch's own new keys (the suffix, causal and tree-masked as the
  scoring plan says), in a slot cache that holds only them.

The two partial softmaxes are merged by their log-sum-exps (as flash-decoding and cascade
inference merge partial attentions; Dao et al., "Flash-Decoding for long-context inference",
2023; Ye et al., "Cascade inference", FlashInfer 2024): with ``o_i = softmax(s_i) V_i`` and
``l_i = logsumexp(s_i)`` over disjoint key sets, the attention over their union is
``(e^{l_1} o_1 + e^{l_2} o_2) / (e^{l_1} + e^{l_2})`` (:func:`merge_partials`). Every real
query of a row sees its whole prefix (the scoring plan masks no prefix key of a real query),
so the prefix part needs no mask.

The forward reads the batch's groups from a context variable (:func:`sharing`), set only
around a scoring forward; everywhere else (prefix encodings, generation, DPS-MOZO, another
engine's forward in the same process) the attention is the engine's usual one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from dpicl.engines.transformers.attention import sdpa_shared_kv

__all__ = [
    "SHARED_PREFIX_ATTENTION",
    "PrefixGroups",
    "attend_lse",
    "attend_shared_prefix",
    "group_prefixes",
    "merge_partials",
    "sharing",
    "use_shared_prefix_attention",
]

SHARED_PREFIX_ATTENTION = "dpicl_shared_prefix"

_ACTIVE: ContextVar[PrefixGroups | None] = ContextVar("dpicl_prefix_groups", default=None)


@dataclass(slots=True)
class PrefixGroups:
    """A batch's rows grouped by prefix: rows ``starts[g]`` to ``starts[g + 1]`` continue
    from ``packed[g]`` (a prefix cache entry's (layers, 2, kv heads, tokens, dim) tensor;
    None: these rows have no cached prefix)."""

    packed: Sequence[torch.Tensor | None]
    starts: Sequence[int]
    # The plan's boolean suffix mask as the additive bias the attention kernel takes, made
    # once per forward (every layer gets the same mask tensor).
    _bias: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def bias_for(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        cached = self._bias
        if cached is not None and cached[0] is mask and cached[1].dtype == dtype:
            return cached[1]
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        bias.masked_fill_(~mask, float("-inf"))
        self._bias = (mask, bias)
        return bias


def group_prefixes(packed: Sequence[torch.Tensor | None]) -> tuple[list[int], PrefixGroups]:
    """Row indices ordered so that rows of the same prefix (``packed[b]``, the same cache
    entry's tensor; None: no prefix) are consecutive, groups in order of first appearance
    and rows in their order within a group; and the groups in that order."""
    members: dict[int, list[int]] = {}
    firsts: dict[int, torch.Tensor | None] = {}
    for b, tensor in enumerate(packed):
        members.setdefault(id(tensor), []).append(b)
        firsts.setdefault(id(tensor), tensor)
    order = [b for rows in members.values() for b in rows]
    starts = [0]
    for rows in members.values():
        starts.append(starts[-1] + len(rows))
    return order, PrefixGroups(list(firsts.values()), starts)


@contextlib.contextmanager
def sharing(groups: PrefixGroups) -> Iterator[None]:
    """Within the block, forwards of a model on :data:`SHARED_PREFIX_ATTENTION` attend to
    ``groups``' prefixes before their cache's keys."""
    token = _ACTIVE.set(groups)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def attend_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
    *,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``query`` (N, heads, M, dim) over ``key``/``value`` (N, heads, K,
    dim), with an additive ``bias`` broadcast to (N, heads, M, K) (``-inf``: masked; every
    query needs one finite key), and its log-sum-exp of the scaled scores, (N, heads, M)
    float32. ``fused`` (default: on the CPU): PyTorch's fused CPU kernel gives both;
    otherwise the product is spelt out (scores in float32)."""
    if fused is None:
        fused = query.device.type == "cpu"
    if fused:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=bias, scale=scale
        )
        return out, lse.float()
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None])
    return torch.matmul(probs.to(value.dtype), value), lse


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over two disjoint key sets from each one's output ``out_*`` (..., M, dim)
    and log-sum-exp ``lse_*`` (..., M): the outputs weighted by each part's share of the
    softmax's normaliser, ``e^{lse_a - lse}`` and ``e^{lse_b - lse}`` with ``lse`` their
    log-add-exp (flash-decoding's merge). Returns the merged output (``out_a``'s dtype) and
    log-sum-exp."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse)[..., None]
    w_b = torch.exp(lse_b - lse)[..., None]
    out = out_a.float() * w_a + out_b.float() * w_b
    return out.to(out_a.dtype), lse


def _prefix_part(
    groups: PrefixGroups, layer: int, query: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's queries (B, heads, S, dim) against its group's prefix of ``layer``: the
    output (B, heads, S, dim) and log-sum-exp (B, heads, S)."""
    n, heads, s, dim = query.shape
    out = query.new_empty((n, heads, s, dim))
    lse = torch.empty((n, heads, s), dtype=torch.float32, device=query.device)
    for g, packed in enumerate(groups.packed):
        start, end = groups.starts[g], groups.starts[g + 1]
        if packed is None:  # no prefix: a part of weight e^-inf = 0 in the merge
            out[start:end] = 0
            lse[start:end] = float("-inf")
            continue
        kv_heads = packed.shape[2]
        rep, m = heads // kv_heads, end - start
        # Query head h reads K/V head h // rep (transformers' repeat_kv): the group's rows
        # and each K/V head's query heads become one query axis against that K/V head.
        folded = (
            query[start:end]
            .reshape(m, kv_heads, rep, s, dim)
            .transpose(0, 1)
            .reshape(1, kv_heads, m * rep * s, dim)
        )
        o, lg = attend_lse(folded, packed[layer, 0][None], packed[layer, 1][None], None, scale)
        out[start:end] = (
            o.reshape(kv_heads, m, rep, s, dim).transpose(0, 1).reshape(m, heads, s, dim)
        )
        lse[start:end] = lg.reshape(kv_heads, m, rep, s).transpose(0, 1).reshape(m, heads, s)
    return out, lse


def attend_shared_prefix(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: with prefix groups active
    (:func:`sharing`), the rows' attention to their group's prefix merged with that to
    ``key``/``value`` (the batch's own tokens, ``attention_mask`` a boolean (B, 1, S, S));
    otherwise :func:`~.attention.sdpa_shared_kv`."""
    groups = _ACTIVE.get()
    if groups is None or attention_mask is None or attention_mask.dtype != torch.bool:
        return sdpa_shared_kv(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    layer = int(getattr(module, "layer_idx", 0))
    out_p, lse_p = _prefix_part(groups, layer, query, scale)
    rep = query.shape[1] // key.shape[1]
    # The suffix is the batch's new tokens only (tens of keys a row): copying its K/V heads
    # to their query heads is cheap, unlike the prefix's.
    keys = key.repeat_interleave(rep, dim=1) if rep > 1 else key
    values = value.repeat_interleave(rep, dim=1) if rep > 1 else value
    out_s, lse_s = attend_lse(
        query, keys, values, groups.bias_for(attention_mask, query.dtype), scale
    )
    out, _ = merge_partials(out_p, lse_p, out_s, lse_s)
    return out.transpose(1, 2).contiguous(), None


def use_shared_prefix_attention(model: Any) -> str:
    """Register :data:`SHARED_PREFIX_ATTENTION` and switch ``model`` to it from ``sdpa`` or
    :data:`~.attention.SHARED_KV_SDPA` (which it falls back to outside a :func:`sharing`
    block); return the attention implementation the model uses afterwards."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from dpicl.engines.transformers.attention import SHARED_KV_SDPA

    AttentionInterface.register(SHARED_PREFIX_ATTENTION, attend_shared_prefix)
    AttentionMaskInterface.register(SHARED_PREFIX_ATTENTION, sdpa_mask)
    if model.config._attn_implementation in ("sdpa", SHARED_KV_SDPA):
        model.set_attn_implementation(SHARED_PREFIX_ATTENTION)
    return str(model.config._attn_implementation)
