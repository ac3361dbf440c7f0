"""The one token an empty prompt becomes (:class:`dpicl.engines.prompting.PromptEncoder`),
shared by the transformers and vLLM engines: BOS, else EOS, else pad, else 0; and the
prefix-once tokenisation before the engine's thread (:class:`PromptTokenizer`, issue 46)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from dpicl.engines.base import PromptSpec
from dpicl.engines.prompting import PromptEncoder, PromptTokenizer, prefix_fingerprint


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


# ---------------------------------------------------------------- PromptTokenizer (issue 46)

QUERIES = [
    "a fine film",
    " leading space",
    "\nleading newline",
    "trailing space ",
    "trailing newline\n",
    "ünïcödé — “quotes” and emoji 🎬",
    "tabs\tand  double  spaces",
    "",
    "Label: Business\n\nInput: a query that looks like a demonstration",
    "<|im_end|> a special token's text",
    "x" * 300,
]


@pytest.fixture(scope="module")
def bundled_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from dpicl.engines.models import DEFAULT_CACHE_DIR, resolve_llm

    return AutoTokenizer.from_pretrained(resolve_llm(None, DEFAULT_CACHE_DIR))


def _prompts(context: str, partitions: int = 3) -> list[PromptSpec]:
    from dpicl.domain import DEFAULT_TEMPLATES
    from dpicl.engines.base import Exemplar
    from dpicl.prompts import render

    out = []
    for p in range(partitions):
        exemplars = [Exemplar(f"demo {p}-{j} of {context}: some text", "Yes") for j in range(2)]
        for q in QUERIES:
            spec = render(
                DEFAULT_TEMPLATES["classification"],
                exemplars,
                q,
                task="classification",
                labels=("Yes", "No"),
                cache_scope=context,
            )
            out.append(replace(spec, cache_key=f"{context}/{p}"))
    return out


def _old_slot(enc: PromptEncoder, prompt: PromptSpec, rendered: str, ids: list[int]) -> Any:
    """What the transformers engine computed before issue 46 (runner.encode_row and
    past.prefix_entries), from the whole rendered prompt."""
    at = rendered.find(prompt.text)
    head = rendered[: at + len(prompt.prefix_text)]
    own = enc.encode_text(head, special=not enc.use_chat_template)
    n = 0
    while n < min(len(own), len(ids)) and own[n] == ids[n]:
        n += 1
    return (prompt.cache_key, prefix_fingerprint(head)), max(min(n, len(own) - 1, len(ids) - 1), 0)


@pytest.mark.parametrize("chat", [True, False])
def test_tokenising_the_suffix_only_gives_the_whole_prompts_ids(
    bundled_tokenizer: Any, chat: bool
) -> None:
    """Each prefix tokenised once and each query's suffix alone gives exactly the ids of the
    whole prompt tokenised at once (so the same scores), and the same prefix-cache slot and
    cached length as the engine computed; the suffix path is what ran."""
    whole = PromptEncoder(bundled_tokenizer, model_name="m", use_chat_template=chat)
    split = PromptTokenizer.from_encoder(whole)
    prompts = _prompts("ctx_a") + _prompts("ctx_b")
    for _ in range(2):  # the second round entirely from the prefixes learnt
        for prompt in prompts:
            rendered, ids = whole.encode(prompt)
            row, got_rendered = split.encode_prompt(prompt, "call:0")
            assert got_rendered == rendered
            assert list(row.ids) == ids, prompt.query
            assert (row.slot, row.prefix_len) == _old_slot(whole, prompt, rendered, ids)
            assert row.scope == prompt.cache_scope
    # 6 prefixes learnt (2 contexts x 3 partitions), every other prompt by its suffix.
    assert len(split._prefixes) == 6
    assert split.suffixes == 2 * len(prompts)
    assert split.whole == 0  # (each prefix was checked once against its whole prompt)


def test_identical_prefixes_of_two_contexts_are_not_shared(bundled_tokenizer: Any) -> None:
    split = PromptTokenizer(bundled_tokenizer, model_name="m")
    a = _prompts("same", 1)[0]
    b = replace(a, cache_scope="other", cache_key="other/0")
    c = replace(a, cache_scope="other", cache_key="same/0")  # another scope, the same key
    for p in (a, b, c):
        split.encode_prompt(p, "call:0")
    assert len(split._prefixes) == 3


def test_a_prefix_that_does_not_split_is_tokenised_whole(
    bundled_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the split tokens differ from the whole prompt's (here a cut inside a word), the
    prefix is remembered as unsplittable and its prompts are tokenised whole: same ids."""
    import dpicl.engines.prompting as prompting

    monkeypatch.setattr(prompting, "_safe_cut", lambda head: len(head) - 5)  # "In|put: "
    whole = PromptEncoder(bundled_tokenizer, model_name="m")
    split = PromptTokenizer.from_encoder(whole)
    prompts = _prompts("ctx", 1)
    for prompt in prompts:
        assert list(split.encode_prompt(prompt, "c")[0].ids) == whole.encode(prompt)[1]
    assert split.suffixes == 0
