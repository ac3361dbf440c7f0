"""Shared-prefix attention (:mod:`dpicl.engines.transformers.shared_prefix`, issue 46 item 3).

The pure parts on random tensors: the log-sum-exp merge of two partial attentions equals
one attention over the union of their keys, and the whole attention function (rows grouped
by prefix, grouped query heads folded onto the prefix's K/V heads) equals plain attention
over each row's own ``[prefix][suffix]`` keys with the K/V heads repeated. Then the engine
on the real bundled SmolLM2 (slow): warm scores with the prefix attended in place equal
those of the slot layout (each prefix copied per row) and whole-prompt forwards to 1e-4,
over batches that mix contexts, partitions and prompt lengths. Deterministic (seeded), so
nothing here fails by chance.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpicl.engines.transformers import shared_prefix
from dpicl.engines.transformers.shared_prefix import (
    attend_lse,
    attend_shared_prefix,
    group_prefixes,
    merge_partials,
    sharing,
)
from dpicl.engines.tuning import EngineTuning

ATOL = 1e-5


def plain_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) masked) v in float64, the definition."""
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


@pytest.mark.parametrize("fused", [True, False])
def test_two_merged_parts_equal_attention_over_all_keys(fused: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 5, 16, generator=gen)
    ka, va = torch.randn(2, 3, 7, 16, generator=gen), torch.randn(2, 3, 7, 16, generator=gen)
    kb, vb = torch.randn(2, 3, 4, 16, generator=gen), torch.randn(2, 3, 4, 16, generator=gen)
    keep_b = torch.rand(2, 1, 5, 4, generator=gen) > 0.5
    keep_b[..., 0] = True
    bias_b = torch.zeros(keep_b.shape).masked_fill(~keep_b, float("-inf"))
    scale = 16**-0.5
    oa, la = attend_lse(q, ka, va, None, scale, fused=fused)
    ob, lb = attend_lse(q, kb, vb, bias_b, scale, fused=fused)
    out, lse = merge_partials(oa, la, ob, lb)
    keep = torch.cat([torch.ones(2, 1, 5, 7, dtype=torch.bool), keep_b], dim=-1)
    k, v = torch.cat([ka, kb], dim=2), torch.cat([va, vb], dim=2)
    torch.testing.assert_close(out.double(), plain_attention(q, k, v, keep), atol=ATOL, rtol=0)
    scores = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=ATOL, rtol=0)
    # Each part alone is attention over its own keys.
    torch.testing.assert_close(oa.double(), plain_attention(q, ka, va, None), atol=ATOL, rtol=0)


def test_the_merge_weights_each_part_by_its_share_of_the_normaliser() -> None:
    # A part whose log-sum-exp is far below the other's contributes nothing; equal ones
    # average.
    a, b = torch.full((1, 1, 2), 1.0), torch.full((1, 1, 2), 3.0)
    out, lse = merge_partials(a, torch.tensor([[0.0]]), b, torch.tensor([[-200.0]]))
    torch.testing.assert_close(out, a)
    torch.testing.assert_close(lse, torch.tensor([[0.0]]))
    out, lse = merge_partials(a, torch.tensor([[0.5]]), b, torch.tensor([[0.5]]))
    torch.testing.assert_close(out, torch.full((1, 1, 2), 2.0))
    torch.testing.assert_close(lse, torch.tensor([[0.5 + float(np.log(2.0))]]), atol=1e-6, rtol=0)


def test_rows_are_grouped_by_prefix_in_order_of_first_appearance() -> None:
    a, b, c = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    order, groups = group_prefixes([b, a, b, c, a, b])
    assert order == [0, 2, 5, 1, 4, 3]
    assert list(groups.starts) == [0, 3, 5, 6]
    assert [id(p) for p in groups.packed] == [id(b), id(a), id(c)]


class _Layer(torch.nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_key_value_groups = 3


@pytest.mark.parametrize("layer", [0, 1])
def test_attention_to_grouped_prefixes_equals_plain_attention_per_row(layer: int) -> None:
    # Three prefixes of 5, 9 and 2 tokens (2 layers, 2 K/V heads of 8 dims) shared by
    # groups of 2, 1 and 3 rows, and two rows without a prefix; 6 query heads (3 per K/V
    # head); 4 new tokens a row under a random mask that keeps each query's own key.
    gen = torch.Generator().manual_seed(11)
    kv_heads, heads, dim, s = 2, 6, 8, 4
    packs: list[torch.Tensor | None] = [
        torch.randn(2, 2, kv_heads, n, dim, generator=gen) for n in (5, 9, 2)
    ]
    packs.append(None)
    row_pack = [0, 3, 1, 0, 2, 2, 3, 2]
    order, groups = group_prefixes([packs[i] for i in row_pack])
    rows = [row_pack[i] for i in order]
    n = len(rows)
    q = torch.randn(n, s, heads, dim, generator=gen).transpose(1, 2)  # as the model's
    k = torch.randn(n, kv_heads, s, dim, generator=gen)
    v = torch.randn(n, kv_heads, s, dim, generator=gen)
    keep = (torch.rand(n, 1, s, s, generator=gen) > 0.4) | torch.eye(s, dtype=torch.bool)
    with sharing(groups):
        out, _ = attend_shared_prefix(_Layer(layer), q, k, v, keep, scaling=dim**-0.5)
    assert out.shape == (n, s, heads, dim)
    for b, p in enumerate(rows):
        pack = packs[p]
        empty = torch.zeros(kv_heads, 0, dim)
        pk, pv = (empty, empty) if pack is None else (pack[layer, 0], pack[layer, 1])
        kk = torch.cat([pk, k[b]], dim=1).repeat_interleave(3, dim=0)
        vv = torch.cat([pv, v[b]], dim=1).repeat_interleave(3, dim=0)
        row_keep = torch.cat([torch.ones(1, s, pk.shape[1], dtype=torch.bool), keep[b]], -1)
        ref = plain_attention(q[b], kk, vv, row_keep)  # (heads, s, dim)
        torch.testing.assert_close(out[b].transpose(0, 1).double(), ref, atol=ATOL, rtol=0)


def test_outside_a_sharing_block_the_attention_is_the_usual_one() -> None:
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 3, 8, generator=gen)
    k, v = torch.randn(2, 2, 3, 8, generator=gen), torch.randn(2, 2, 3, 8, generator=gen)
    keep = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    out, _ = attend_shared_prefix(_Layer(0), q, k, v, keep, scaling=8**-0.5)
    ref = plain_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), keep)
    torch.testing.assert_close(out.transpose(1, 2).double(), ref, atol=ATOL, rtol=0)


def test_the_setting_is_validated_and_auto_is_on_where_measured() -> None:
    auto = EngineTuning()
    assert auto.shares_prefix_attention("cpu", 192)  # SmolLM2-135M: 3 K/V heads of 64
    assert not auto.shares_prefix_attention("cpu", 64)  # bench/gpu.py --tiny's toy
    assert not auto.shares_prefix_attention("cuda", 1024)  # not measured there
    assert EngineTuning(shared_prefix="on").shares_prefix_attention("cuda", 64)
    assert not EngineTuning(shared_prefix="off").shares_prefix_attention("cpu", 1024)
    with pytest.raises(ValueError, match="shared_prefix must be auto, on or off, got 'yes'"):
        EngineTuning(shared_prefix="yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------- the real model

if True:  # the real-model part: imports that load the server's modules
    from dpicl.engines.base import PromptSpec
    from dpicl.engines.transformers.engine import TransformersEngine
    from dpicl.pipelines.partitions import partition_prompts
    from dpicl.store.repository import ContextRepository
    from tests.server.real_model import load_bundled
    from tests.server.reference_scores import whole_prompt_scores
    from tests.server.test_prefix_reuse import LABELS, QUERIES, news_context

TOL = 1e-4


@pytest.fixture(scope="module")
def model() -> Iterator[TransformersEngine]:
    eng = load_bundled()
    yield eng
    asyncio.run(eng.aclose())


def engine_with(base: TransformersEngine, shared: str) -> TransformersEngine:
    return TransformersEngine(
        base.model_obj, base.tokenizer, model_name="t", tuning=EngineTuning(shared_prefix=shared)
    )


@pytest.fixture
async def repo(tmp_path: Path) -> AsyncIterator[ContextRepository]:
    r = ContextRepository(f"sqlite:///{tmp_path / 'ctx.db'}")
    r.create_schema()
    yield r
    r.dispose()


@pytest.mark.slow
async def test_warm_scores_attending_in_place_equal_the_copied_layout(
    model: TransformersEngine, repo: ContextRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    on, off = engine_with(model, "on"), engine_with(model, "off")
    assert on.shared_prefix_attention and not off.shared_prefix_attention
    # Two contexts (prefixes of different lengths: other partitions, other exemplars),
    # three queries of different lengths: one merged batch of 2 x 3 + 3 x 3 rows, several
    # rows per prefix (the same partition asked by several queries).
    a = await news_context(repo, partitions=2, seed=1)
    b = await news_context(repo, partitions=3, seed=2)
    jobs: list[tuple[Any, list[str]]] = [
        (partition_prompts(ctx, query), labels)
        for query in QUERIES
        for ctx, labels in ((a, LABELS), (b, ["Sports", "World"]))
    ]
    # And a prompt without a cache key (no cached prefix) in the same batch.
    jobs.append(([PromptSpec(text="Headline: rain stopped play. Topic:", query="q")], LABELS))
    for eng in (on, off):  # cold: fills each engine's prefix cache
        await asyncio.gather(*[eng.score_labels(p, labels) for p, labels in jobs])
    calls: list[int] = []
    prefix_part = shared_prefix._prefix_part

    def counted(groups: Any, *args: Any) -> Any:
        calls.append(len(groups.packed))
        return prefix_part(groups, *args)

    monkeypatch.setattr(shared_prefix, "_prefix_part", counted)
    got = await asyncio.gather(*[on.score_labels(p, labels) for p, labels in jobs])
    n_layers = model.model_obj.config.num_hidden_layers
    # One warm batch: five prefixes and the prompt without one, every layer in place.
    assert calls == [6] * n_layers
    ref = await asyncio.gather(*[off.score_labels(p, labels) for p, labels in jobs])
    assert len(calls) == n_layers  # the copied layout never attends in place
    for (prompts, labels), g, r in zip(jobs, got, ref, strict=True):
        np.testing.assert_allclose(g, r, atol=TOL, rtol=0)
        np.testing.assert_allclose(g, whole_prompt_scores(on, prompts, labels), atol=TOL)
