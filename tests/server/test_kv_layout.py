"""The transformers engine's batch layouts (:mod:`dpicl.engines.transformers.kv_layout`)
against plain forwards, on a tiny Llama with random weights (the layouts are model-agnostic
tensor plumbing; the real-model tests are in test_transformers_engine.py and
test_prefix_reuse.py).

The reference scores every (row, label) alone: one forward over prefix + rest + label, no
padding, no cache, no 4D mask. The layout under test stacks cached prefixes of different
lengths, left pads rests of different lengths and puts every multi-token label on its own
branch of one forward. Equal to 1e-5 (float32 rounding) or the layout is wrong; the same
with the engine's grouped-K/V attention on CPU (:mod:`dpicl.engines.transformers.attention`), whose
reference forwards go through transformers' own ``sdpa`` (no mask there).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dpicl.engines.transformers.attention import SHARED_KV_SDPA, use_shared_kv_sdpa
from dpicl.engines.transformers.kv_layout import (
    attention_mask_for,
    pack_layers,
    plan_scoring,
    prefix_mask,
    slot_prefixes,
    stack_packed,
    stack_prefixes,
)
from dpicl.engines.transformers.slot_cache import SlotCache

VOCAB = 64


def tiny_llama(attn: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    if attn == SHARED_KV_SDPA:
        model = tiny_llama("sdpa")
        assert use_shared_kv_sdpa(model) == SHARED_KV_SDPA
        return model

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(cfg).eval()


def reference(model: Any, ids: list[int], label: list[int]) -> float:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids + label])).logits[0].double()
    logp = logits.log_softmax(-1)
    return sum(float(logp[len(ids) - 1 + k, t]) for k, t in enumerate(label))


# Rows: (prefix, rest); prefixes of different lengths (one row without), rests of
# different lengths; labels of one to three tokens, the same tokens after every row.
ROWS = [
    ([1, 2, 3, 4, 5, 6, 7], [8, 9, 10]),
    ([1, 2, 3, 11], [12, 13, 14, 15, 16]),
    ([], [17, 18]),
    ([1, 2, 3, 4, 5, 6, 7, 19, 20, 21], [22]),
]
LABELS = [[30], [31, 32], [33, 34, 35], [36, 37]]


@pytest.mark.parametrize(
    ("attn", "layout"),
    [
        ("sdpa", "stacked"),
        ("sdpa", "packed"),
        (SHARED_KV_SDPA, "packed"),
        ("eager", "packed"),
        (SHARED_KV_SDPA, "slots"),
        ("eager", "slots"),
    ],
)
def test_one_forward_with_label_branches_equals_one_forward_per_label(
    attn: str, layout: str
) -> None:
    from transformers import DynamicCache

    model = tiny_llama(attn)
    cache: Any
    found: list[Any] = []
    with torch.inference_mode():
        for prefix, _ in ROWS:
            if not prefix:
                found.append(None)
                continue
            res = model(input_ids=torch.tensor([prefix]), use_cache=True)
            found.append([(k, v) for k, v, *_ in res.past_key_values])
        lens = [len(p) for p, _ in ROWS]
        packs = [pack_layers(f)[0] if f is not None else None for f in found]
        if layout == "packed":
            layers, past_mask = stack_packed(packs, lens, torch.device("cpu"))
        elif layout == "stacked":
            layers, past_mask = stack_prefixes(found, lens, torch.device("cpu"))
        else:
            past_mask = prefix_mask(lens, torch.device("cpu"))
        labels = [LABELS] * len(ROWS)
        plan = plan_scoring([r for _, r in ROWS], labels, lens, past_mask, pad_id=0)
        if layout == "slots":
            # Reused scratch memory holds anything: NaN where nothing is written would
            # poison every score.
            room, (n_layers, _, heads, _, dim) = plan.input_ids.shape[1], packs[0].shape
            slots = torch.full((n_layers, 2, len(ROWS), heads, max(lens) + room, dim), torch.nan)
            cache = SlotCache(slot_prefixes(packs, lens, room, slots), max(lens))
        else:
            cache = DynamicCache(ddp_cache_data=layers)
        out = model(
            input_ids=plan.input_ids,
            attention_mask=attention_mask_for(plan.mask, attn, model.dtype),
            position_ids=plan.position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=plan.keep,
        )
    # Logits only where a label token is read: each row's last rest token, 1 + 2 + 1 branch
    # tokens per row.
    assert out.logits.shape == (len(ROWS) * 5, VOCAB)
    logp = out.logits.double().log_softmax(-1)
    for b, (prefix, rest) in enumerate(ROWS):
        for j, lab in enumerate(LABELS):
            got = sum(float(logp[i, t]) for i, t in plan.reads[b][j])
            assert [t for _, t in plan.reads[b][j]] == lab
            assert got == pytest.approx(reference(model, prefix + rest, lab), abs=1e-5)
    if layout == "slots":  # the new tokens were written into the slots, not concatenated
        assert cache.layers[0].keys.data_ptr() == slots.data_ptr()
        assert not slots.isnan().any()


def test_branches_see_their_row_and_themselves_only() -> None:
    past = torch.tensor([[0, 1, 1], [1, 1, 1]])
    plan = plan_scoring([[5, 6], [7]], [[[1, 2], [3, 4, 4]], [[1], [2, 2]]], [2, 3], past, 0)
    # Row 0: [5 6 | 1 | 3 4]; row 1: [pad 7 | 2 | pad pad] (S = 5, W = 3).
    assert plan.input_ids.tolist() == [[5, 6, 1, 3, 4], [0, 7, 2, 0, 0]]
    assert plan.position_ids[0].tolist() == [2, 3, 4, 4, 5]
    assert plan.position_ids[1].tolist()[1:3] == [3, 4]
    m = plan.mask[:, 0]
    assert m.shape == (2, 5, 8)
    # Row 0's branch of "3 4 4" (columns 3, 4) sees the past's real keys, the rest, itself,
    # never the other label's branch (column 2).
    assert m[0, 4].tolist() == [False, True, True, True, True, False, True, True]
    assert m[0, 2].tolist() == [False, True, True, True, True, True, False, False]
    # No real query of row 1 attends its pad columns; a pad query sees itself only.
    assert not m[1, 1:3, 3].any() and not m[1, 1:3, 6:].any()
    assert m[1, 0].tolist() == [False] * 3 + [True] + [False] * 4
    keep = [[False, True, True, True, True], [False, True, True, False, False]]
    assert plan.keep.tolist() == keep
    assert plan.reads[1] == [[(4, 1)], [(4, 2), (5, 2)]]


def _reference_layout(
    rests: list[list[int]], labels: list[list[list[int]]], offsets: list[int], s: int
) -> tuple[list[list[tuple[int, int, int, int]]], list[list[list[tuple[int, int]]]]]:
    """Per row, per column: (token, position, segment, kept) from the layout's definition
    (``[pads][rest][branch 1][branch 2]...[pads]``, segment -1 pad, 0 rest, k branch k),
    and the reads as (flat kept index, token), counted by walking the kept columns."""
    r_width = max(len(r) for r in rests)
    grid, reads, kept = [], [], 0
    for rest, labs, off in zip(rests, labels, offsets, strict=True):
        cols = [(0, 0, -1, 0)] * (r_width - len(rest))
        cols += [(t, off + i, 0, 0) for i, t in enumerate(rest)]
        cols[-1] = (*cols[-1][:3], 1)
        flat_of_col, row = {len(cols) - 1: kept}, []
        n_kept = kept + 1
        for k, lab in enumerate([lab for lab in labs if len(lab) > 1], start=1):
            for i, t in enumerate(lab[:-1]):
                flat_of_col[len(cols)] = n_kept
                n_kept += 1
                cols.append((t, off + len(rest) + i, k, 1))
        cols += [(0, 0, -1, 0)] * (s - len(cols))
        branch_cols = iter(sorted(c for c in flat_of_col if c >= r_width))
        for lab in labs:
            got = [(kept, lab[0])]
            got += [(flat_of_col[next(branch_cols)], t) for t in lab[1:]]
            row.append(got)
        grid.append(cols)
        reads.append(row)
        kept = n_kept
    return grid, reads


def test_a_plan_matches_the_layout_definition_on_random_batches() -> None:
    # The plan is built for whole batches at once (segment comparisons); this checks every
    # token, position and mask entry against the layout's definition, element by element.
    gen = torch.Generator().manual_seed(11)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    for _ in range(60):
        n = draw(1, 5)
        rests = [[draw(1, 60) for _ in range(draw(1, 6))] for _ in range(n)]
        labels = [[[draw(1, 60) for _ in range(draw(1, 4))] for _ in range(draw(1, 4))]] * n
        lens = [draw(0, 5) for _ in range(n)]
        past = prefix_mask(lens, torch.device("cpu"))
        plan = plan_scoring(rests, labels, lens, past, pad_id=0)
        s, w = plan.input_ids.shape[1], past.shape[1]
        grid, reads = _reference_layout(rests, labels, lens, s)
        assert plan.reads == reads
        for b in range(n):
            assert plan.input_ids[b].tolist() == [c[0] for c in grid[b]]
            assert plan.keep[b].tolist() == [bool(c[3]) for c in grid[b]]
            for i, (_, pos_i, seg_i, _) in enumerate(grid[b]):
                if seg_i >= 0:
                    assert int(plan.position_ids[b, i]) == pos_i
                want = [bool(past[b, j]) and seg_i >= 0 for j in range(w)]
                for j, (_, _, seg_j, _) in enumerate(grid[b]):
                    if seg_i < 0:
                        want.append(i == j)  # a pad query sees itself only
                    elif seg_j == 0:
                        want.append(seg_i > 0 or j <= i)
                    else:
                        want.append(seg_j == seg_i and j <= i)
                assert plan.mask[b, 0, i].tolist() == want, (b, i)


def test_integer_kept_positions_read_what_the_boolean_ones_read() -> None:
    # The scorer passes ``keep_at`` (K positions a row, no device read for the count) and
    # reads ``read_at`` in the (B x K) rows; the boolean ``keep`` with ``reads`` is the
    # definition. Rows with other labels keep other numbers of positions.
    gen = torch.Generator().manual_seed(5)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    for _ in range(40):
        n = draw(1, 5)
        rests = [[draw(1, 60) for _ in range(draw(1, 6))] for _ in range(n)]
        labels = [
            [[draw(1, 60) for _ in range(draw(1, 4))] for _ in range(draw(1, 4))] for _ in range(n)
        ]
        lens = [draw(0, 5) for _ in range(n)]
        plan = plan_scoring(rests, labels, lens, prefix_mask(lens, torch.device("cpu")), 0)
        logits = torch.randn(n, plan.input_ids.shape[1], 61, generator=gen)
        by_mask = logits[plan.keep]
        want = [float(by_mask[i, t]) for row in plan.reads for lab in row for i, t in lab]
        by_int = torch.take_along_dim(logits, plan.keep_at[..., None], dim=1).flatten(0, 1)
        got = by_int[plan.read_at[:, 0], plan.read_at[:, 1]]
        assert got.tolist() == want
        assert plan.keep_at.shape[1] == int(plan.keep.sum(1).max())


def test_attention_mask_forms() -> None:
    mask = torch.tensor([[[[True, False]]]])
    assert attention_mask_for(mask, "sdpa", torch.float32) is mask
    add = attention_mask_for(mask, "eager", torch.float32)
    assert add.tolist() == [[[[0.0, torch.finfo(torch.float32).min]]]]
    with pytest.raises(ValueError, match="flash_attention_2"):
        attention_mask_for(mask, "flash_attention_2", torch.float32)


def test_the_engine_refuses_attention_without_dense_masks() -> None:
    from dpicl.engines.transformers.engine import TransformersEngine
    from dpicl.errors import EngineError

    model = tiny_llama("sdpa")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(EngineError, match="flash_attention_2"):
        TransformersEngine(model, None, model_name="tiny")


def test_shared_kv_attention_matches_stock_sdpa_on_a_padded_batch() -> None:
    stock, shared = tiny_llama("sdpa"), tiny_llama(SHARED_KV_SDPA)
    assert stock.config._attn_implementation == "sdpa"
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        a = stock(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        b = shared(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], atol=1e-6, rtol=0)
