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
        # Token count of each fallback prompt seen (by text; see encode_used).
        self._fallback_lengths: dict[str, int] = {}

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

    def _tokens(self, prompt: PromptSpec) -> tuple[str, list[int]]:
        rendered = self.render(prompt)
        # A chat template writes its own special tokens; a raw prompt gets the tokenizer's.
        ids = self.encode_text(rendered, special=not self.use_chat_template)
        if not ids:
            ids = [self.empty_prompt_token_id]
        return rendered, ids

    def _fits(self, ids: list[int]) -> bool:
        return self.max_positions is None or len(ids) < self.max_positions

    def _too_long(self, n_tokens: int) -> InvalidRequest:
        return InvalidRequest(
            f"the prompt has {n_tokens} tokens; the model {self.model_name!r} accepts "
            f"fewer than {self.max_positions}"
        )

    def encode_used(self, prompt: PromptSpec) -> tuple[PromptSpec, str, list[int]]:
        """The prompt that runs (``prompt``, or its ``fallback`` when ``prompt`` does not
        fit the model), its rendering and its token ids.

        The refusal depends on public text only: when ``prompt`` has a fallback, the call
        is refused exactly when the fallback does not fit, whether ``prompt`` would have
        fitted or not, and the message quotes the fallback's length. ``prompt`` holds
        private exemplars there (:attr:`PromptSpec.fallback`); a refusal, or a message,
        that depended on it would release its length un-noised and, raised inside the
        refunded engine call, for free.
        """
        if self.max_positions is None:  # nothing is ever too long: no fallback is used
            return (prompt, *self._tokens(prompt))
        chain = [prompt]
        while (nxt := chain[-1].fallback) is not None:
            chain.append(nxt)
        last = chain[-1]
        if len(chain) > 1:
            # The public check first (memoised: a query's T prompts share one fallback).
            n = self._fallback_lengths.get(last.text)
            if n is None:
                n = len(self._tokens(last)[1])
                if len(self._fallback_lengths) > _LABEL_CACHE_MAX:
                    self._fallback_lengths.clear()
                self._fallback_lengths[last.text] = n
            if n >= self.max_positions:
                raise self._too_long(n)
        for p in chain:
            rendered, ids = self._tokens(p)
            if self._fits(ids):
                return p, rendered, ids
            if p is last:
                raise self._too_long(len(ids))
        raise AssertionError("unreachable: the chain ends with its last prompt")

    def encode(self, prompt: PromptSpec) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids (a 4xx if the model cannot take it), of
        ``prompt`` or of its fallback (:meth:`encode_used`)."""
        _, rendered, ids = self.encode_used(prompt)
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
