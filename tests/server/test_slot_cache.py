"""The in-place KV cache of warm scoring batches and its reused scratch memory
(:mod:`dpicl.engines.transformers.slot_cache`). The model-level check (a forward on a slot
cache scores as one plain forward per label) is in test_kv_layout.py; the real-model one in
test_prefix_reuse.py."""

from __future__ import annotations

import pytest
import torch

from dpicl.engines.transformers.slot_cache import KVWorkspace, SlotCache, SlotLayer, own_slots


def test_a_slot_layer_writes_new_tokens_after_its_past_in_place() -> None:
    keys, values = torch.zeros(2, 3, 6, 4), torch.zeros(2, 3, 6, 4)
    keys[:, :, :2], values[:, :, :2] = 1.0, 2.0
    layer = SlotLayer(keys, values, filled=2)
    assert layer.get_seq_length() == 2
    new_k, new_v = torch.full((2, 3, 3, 4), 5.0), torch.full((2, 3, 3, 4), 6.0)
    k, v = layer.update(new_k, new_v)
    assert k.shape == (2, 3, 5, 4) and layer.get_seq_length() == 5
    assert k.data_ptr() == keys.data_ptr() and v.data_ptr() == values.data_ptr()
    assert torch.equal(keys[:, :, :5], torch.cat([torch.ones(2, 3, 2, 4), new_k], dim=2))
    assert torch.equal(values[:, :, 2:5], new_v)


def test_a_slot_layer_past_its_room_moves_to_slots_of_twice_the_size() -> None:
    keys, values = torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2)
    keys[:, :, :2] = 7.0
    layer = SlotLayer(keys, values, filled=2)
    k, _ = layer.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))  # 4 > 3 slots
    assert k.shape == (1, 1, 4, 2) and k.data_ptr() != keys.data_ptr()
    assert layer.capacity == 6  # twice 3, which holds the 4 needed
    assert not keys[:, :, 2].any()  # the old slots were left alone
    assert torch.equal(k[:, :, :2], keys[:, :, :2])  # the past moved along
    moved = k.data_ptr()
    k, _ = layer.update(torch.full((1, 1, 2, 2), 3.0), torch.ones(1, 1, 2, 2))
    assert k.shape == (1, 1, 6, 2) and float(k[0, 0, -1, 0]) == 3.0
    assert k.data_ptr() == moved  # in place again until full
    k, _ = layer.update(torch.ones(1, 1, 9, 2), torch.ones(1, 1, 9, 2))  # needs 15 > 12
    assert layer.capacity == 15 and k.shape == (1, 1, 15, 2)
    assert float(k[0, 0, 5, 0]) == 3.0


def test_own_slots_copy_a_cache_with_room() -> None:
    layers = [(torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)) for _ in range(3)]
    cache = own_slots(layers, room=4)
    assert len(cache.layers) == 3 and cache.get_seq_length() == 5
    for layer, (k, v) in zip(cache.layers, layers, strict=True):
        assert isinstance(layer, SlotLayer) and layer.capacity == 9
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
        assert layer.keys.data_ptr() != k.data_ptr()  # a copy: the session owns it


def test_a_slot_cache_has_one_layer_per_model_layer() -> None:
    slots = torch.zeros(4, 2, 3, 2, 7, 8)
    cache = SlotCache(slots, filled=5)
    assert len(cache.layers) == 4 and cache.get_seq_length() == 5
    assert cache.layers[2].keys.data_ptr() == slots[2, 0].data_ptr()
    assert cache.layers[2].values.data_ptr() == slots[2, 1].data_ptr()


def test_the_workspace_reuses_memory_within_its_bound() -> None:
    like = torch.zeros(1)
    ws = KVWorkspace(keep_bytes=4 * 100)
    a = ws.take((2, 50), like)
    assert ws.kept_bytes == 400
    b = ws.take((5, 4), like)  # smaller: the same memory
    assert b.data_ptr() == a.data_ptr() and b.shape == (5, 4)
    big = ws.take((101,), like)  # over the bound: memory of its own, not kept
    assert big.data_ptr() != a.data_ptr() and ws.kept_bytes == 400
    assert ws.take((3,), like).data_ptr() == a.data_ptr()
    half = ws.take((10,), torch.zeros(1, dtype=torch.float16))  # another dtype: new memory
    assert half.dtype == torch.float16 and half.data_ptr() != a.data_ptr()
    ws.release()
    assert ws.kept_bytes == 0


def test_a_workspace_of_zero_bytes_keeps_nothing() -> None:
    ws = KVWorkspace(keep_bytes=0)
    assert ws.take((3, 3), torch.zeros(1)).shape == (3, 3)
    assert ws.kept_bytes == 0
    with pytest.raises(ValueError, match="-1"):
        KVWorkspace(keep_bytes=-1)
