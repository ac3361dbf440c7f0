"""Prompt text -> token ids, and label tokenisation, for engines that tokenise themselves.

Both engines that tokenise themselves (transformers and vLLM) use this one class, so they
see the same tokens for the same :class:`~dpicl.engines.base.PromptSpec` and score the same
label tokens:

* with a chat template, ``PromptSpec.text`` is the single user message and the generation
  prompt is appended; otherwise the text is used as it is, with the tokenizer's special
  tokens;
* a label's tokens are those of ``tail + sep + label`` beyond those of ``tail`` (the rendered
  prompt's last 64 characters; ``sep`` is one space unless the prompt ends with whitespace),
  or the label tokenised on its own if the tokenizer merges across that boundary. So a label
  is tokenised as it would appear in the rendered prompt followed by the label: directly
  after a chat template's generation prompt (which ends with a newline), after one space
  after a raw prompt ending in ``"Label:"`` (answered ``" Positive"``);
* an empty prompt is one token, so the model has a position to predict from
  (:attr:`PromptEncoder.empty_prompt_token_id`).
"""

from __future__ import annotations

from typing import Any

from dpicl.engines.base import PromptSpec
from dpicl.errors import InvalidRequest

__all__ = ["PromptEncoder"]

_TAIL_CHARS = 64
_LABEL_CACHE_MAX = 4096


class PromptEncoder:
    """Render and tokenise prompts and labels with one Hugging Face tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        model_name: str,
        use_chat_template: bool = True,
        max_positions: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.use_chat_template = bool(
            use_chat_template and getattr(tokenizer, "chat_template", None)
        )
        self.max_positions = max_positions
        self._label_cache: dict[tuple[str, str], list[int]] = {}

    def render(self, prompt: PromptSpec) -> str:
        """The string the model sees for ``prompt`` (chat template applied if enabled)."""
        if not self.use_chat_template:
            return prompt.text
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}],
            tokenize=False,
            add_generation_prompt=True,
        )
        return str(rendered)

    @property
    def empty_prompt_token_id(self) -> int:
        """The one token an empty prompt is encoded as, so the model has a position to
        predict from: BOS, else EOS (the document separator of models without a BOS; a pad
        token is never fed as input), else the pad token, else 0."""
        for tok in (
            self.tokenizer.bos_token_id,
            self.tokenizer.eos_token_id,
            self.tokenizer.pad_token_id,
        ):
            if tok is not None:
                return int(tok)
        return 0

    def encode_text(self, text: str, *, special: bool) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=special)["input_ids"]]

    def encode(self, prompt: PromptSpec) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids (a 4xx if the model cannot take it)."""
        rendered = self.render(prompt)
        # A chat template writes its own special tokens; a raw prompt gets the tokenizer's.
        ids = self.encode_text(rendered, special=not self.use_chat_template)
        if not ids:
            ids = [self.empty_prompt_token_id]
        if self.max_positions is not None and len(ids) >= self.max_positions:
            raise InvalidRequest(
                f"the prompt has {len(ids)} tokens; the model {self.model_name!r} accepts "
                f"fewer than {self.max_positions}"
            )
        return rendered, ids

    def label_ids(self, rendered_prompt: str, label: str) -> list[int]:
        """Token ids of ``label`` as the answer that follows ``rendered_prompt``."""
        tail = rendered_prompt[-_TAIL_CHARS:]
        key = (tail, label)
        cached = self._label_cache.get(key)
        if cached is not None:
            return cached
        sep = "" if (not tail or tail[-1].isspace()) else " "
        base = self.encode_text(tail, special=False)
        full = self.encode_text(tail + sep + label, special=False)
        if len(full) > len(base) and full[: len(base)] == base:
            ids = full[len(base) :]
        else:
            ids = self.encode_text(sep + label, special=False)
        if not ids:
            raise InvalidRequest(f"the label {label!r} has no tokens", param="labels")
        if len(self._label_cache) > _LABEL_CACHE_MAX:
            self._label_cache.clear()
        self._label_cache[key] = ids
        return ids
