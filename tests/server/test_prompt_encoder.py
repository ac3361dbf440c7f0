"""The one token an empty prompt becomes (:class:`dpicl.engines.prompting.PromptEncoder`),
shared by the transformers and vLLM engines: BOS, else EOS, else pad, else 0."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dpicl.engines.base import PromptSpec
from dpicl.engines.prompting import PromptEncoder


@dataclass
class SpecialIds:
    """A tokenizer with no vocabulary: every text encodes to no tokens, so only its
    special-token ids decide what an empty prompt becomes."""

    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    chat_template: None = None

    def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
        return {"input_ids": []}


@pytest.mark.parametrize(
    ("bos", "eos", "pad", "want"),
    [(5, 6, 7, 5), (None, 6, 7, 6), (None, None, 7, 7), (None, None, None, 0), (None, 0, 7, 0)],
)
def test_an_empty_prompt_is_one_special_token(
    bos: int | None, eos: int | None, pad: int | None, want: int
) -> None:
    enc = PromptEncoder(SpecialIds(bos, eos, pad), model_name="m")
    assert enc.encode(PromptSpec(text="", query=""))[1] == [want]
