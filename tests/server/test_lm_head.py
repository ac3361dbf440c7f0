"""The vocabulary projection in blocks (:mod:`dpicl.engines.transformers.lm_head`) against the
``nn.Linear`` it replaces: the same products, so equal to float rounding (1e-5 here)."""

from __future__ import annotations

import pytest
import torch

from dpicl.engines.transformers.lm_head import BlockedLMHead, use_blocked_lm_head


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 16), (3, 7, 16), (5, 16)])
def test_blocked_projection_equals_the_linear(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 37, bias=bias)  # 37 = 3 blocks of 10 and one of 7
    x = torch.randn(*shape)
    with torch.inference_mode():
        got = BlockedLMHead(head, block_rows=10)(x)
        want = head(x)
    assert got.shape == want.shape == (*shape[:-1], 37)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_with_gradients_it_falls_back_to_the_linear() -> None:
    head = torch.nn.Linear(4, 6)
    x = torch.randn(2, 4, requires_grad=True)
    BlockedLMHead(head, block_rows=4)(x).sum().backward()
    assert x.grad is not None and head.weight.grad is not None


def test_the_swap_keeps_tied_weights_and_leaves_other_heads() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    assert use_blocked_lm_head(model, block_rows=8)
    head = model.get_output_embeddings()
    assert isinstance(head, BlockedLMHead)
    assert head.weight is model.get_input_embeddings().weight
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, before, atol=1e-5, rtol=0)
    assert use_blocked_lm_head(model)  # already blocked: unchanged
    assert model.get_output_embeddings() is head

    class Other(torch.nn.Module):
        def get_output_embeddings(self) -> torch.nn.Module:
            return torch.nn.Identity()

    assert not use_blocked_lm_head(Other())
    with pytest.raises(ValueError, match="0"):
        BlockedLMHead(torch.nn.Linear(2, 2), block_rows=0)
