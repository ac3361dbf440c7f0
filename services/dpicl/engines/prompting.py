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

:class:`PromptTokenizer` does the same work before a prompt reaches the engine's thread
(issue 46: in the engine process, tokenising and templating were 27% of the one thread that
runs the model). It sends :class:`EncodedPrompt` rows: token ids, the prefix-cache slot and
how many leading tokens that slot's KV state covers. Each (context and partition, prefix)
is rendered and tokenised once; a later prompt with the same prefix has only its suffix
tokenised, and its ids are exactly those of the whole prompt tokenised at once (see
:meth:`PromptTokenizer._tokens` for why, and when it falls back to the whole prompt).
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpicl.engines.base import PromptSpec
from dpicl.errors import InvalidRequest

__all__ = ["EncodedPrompt", "PromptEncoder", "PromptTokenizer", "prefix_fingerprint"]

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


def prefix_fingerprint(rendered_prefix: str) -> str:
    """A collision-resistant fingerprint of the prefix text the model sees."""
    return hashlib.sha256(rendered_prefix.encode("utf-8", "surrogatepass")).hexdigest()


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    """A prompt as the engine's thread receives it: nothing left to render or tokenise.

    ``ids`` are the prompt's tokens (of its fallback where that is the one that runs).
    ``slot`` is the prefix-cache key ``(PromptSpec.cache_key, fingerprint of the rendered
    prefix)``, or None: the engine may keep the KV state of the first ``prefix_len`` tokens
    under it (one short of the prefix's own tokens, so the token a tokeniser may merge with
    the query is the query's). ``scope`` says which rows may share computed state
    (``PromptSpec.cache_scope``, or a marker of the call for prompts without a context).
    """

    ids: tuple[int, ...]
    scope: str
    slot: tuple[str, str] | None = None
    prefix_len: int = 0


@dataclass(frozen=True, slots=True)
class _Prefix:
    """What one (cache key, scope, rendered prefix) needs tokenised once."""

    ok: bool  # False: prompts on this prefix are tokenised whole
    cut: int = 0  # characters of the rendered prompt whose tokens are ``ids``
    ids: tuple[int, ...] = ()
    own: tuple[int, ...] = ()  # tokens of the rendered prefix alone
    head: int = 0  # len(pre) + prefix_chars: the rendered prefix's length
    fingerprint: str = ""


def _safe_cut(head: str) -> int:
    """The last position in ``head`` between a letter or digit and a newline, or 0.

    A tokeniser that first splits text into words by a regular expression (GPT-2's and
    Llama-3's byte-level BPE, SmolLM2's) ends a word there whatever follows: a run of
    letters or digits never takes a newline, and a word that holds a newline starts with
    whitespace or punctuation. And the words before it are the same whether the text goes
    on or not: the last is a run of letters or digits, complete at the newline. (Not after
    the newline: a run of newlines at the end of a text is one word, followed by a letter
    it is split, so ``"\\n\\n"`` then ``"Input"`` tokenises differently from ``"\\n\\n"`` alone.)
    """
    for i in range(len(head) - 1, 0, -1):
        if head[i] == "\n" and head[i - 1].isalnum():
            return i
    return 0


class PromptTokenizer(PromptEncoder):
    """A :class:`PromptEncoder` for the server's side of the engine boundary: it turns
    prompts into :class:`EncodedPrompt` rows and scored labels into token ids, with each
    prefix tokenised once.

    Its prefix memo is keyed by ``(cache_key, cache_scope, fingerprint)``: two contexts
    never share an entry, even for identical text (the same rule as the engine's KV prefix
    cache). It is bounded (LRU, ``max_prefixes``). Not thread-safe: one thread (the server's
    event loop) uses it.
    """

    def __init__(self, *args: Any, max_prefixes: int = 4096, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_prefixes = max_prefixes
        self._prefixes: OrderedDict[tuple[str, str, str], _Prefix] = OrderedDict()
        self._wrap: tuple[str, str] | None = None
        self._wrap_probed = False
        #: Whole prompts tokenised, and suffixes only (for tests and the bench).
        self.whole = 0
        self.suffixes = 0

    @classmethod
    def from_encoder(cls, encoder: PromptEncoder, **kwargs: Any) -> PromptTokenizer:
        """The same settings as ``encoder``, on a copy of its tokenizer: a Hugging Face
        fast tokenizer sets its padding and truncation state on every call and refuses
        ("Already borrowed") a call on another thread meanwhile, and the engine's own
        encoder may still run in the engine's thread (a DPS-MOZO session's prompts)."""
        return cls(
            copy.deepcopy(encoder.tokenizer),
            model_name=encoder.model_name,
            use_chat_template=encoder.use_chat_template,
            max_positions=encoder.max_positions,
            **kwargs,
        )

    # ------------------------------------------------------------------ rendering

    def _template_wrap(self) -> tuple[str, str] | None:
        """``(before, after)`` such that the chat template renders a text as
        ``before + text + after``, or None when it does something else to the text
        (probed once, with texts that a trimming or escaping template would change)."""
        if not self._wrap_probed:
            wrap: tuple[str, str] | None = ("", "")
            if self.use_chat_template:
                probe = "dpicl probe"
                out = super().render(PromptSpec(text=probe, query=""))
                at = out.find(probe)
                wrap = (out[:at], out[at + len(probe) :]) if at >= 0 else None
                for other in (" x\n", "<&'\"> {{ y }}\n\n"):
                    got = super().render(PromptSpec(text=other, query=""))
                    if wrap is None or got != wrap[0] + other + wrap[1]:
                        wrap = None
            self._wrap, self._wrap_probed = wrap, True
        return self._wrap

    # ------------------------------------------------------------------ tokens

    def _tokens(self, prompt: PromptSpec) -> tuple[str, list[int]]:
        """The rendered prompt and its ids, with its prefix's tokens memoised.

        The ids are those of the whole prompt tokenised at once: the first time a prefix
        is seen, the whole prompt is tokenised as well and compared with the split (tokens
        of the rendered prompt up to :func:`_safe_cut`, then the rest); a prefix that does
        not split (a tokeniser that is not word-split, a template that changes the text) is
        remembered as such and its prompts are tokenised whole, as before."""
        wrap = self._template_wrap() if prompt.cache_key and prompt.prefix_chars else None
        if wrap is None:
            self.whole += 1
            return super()._tokens(prompt)
        pre, post = wrap
        rendered = pre + prompt.text + post
        entry = self._prefix(prompt, rendered, len(pre))
        if not entry.ok:
            self.whole += 1
            return super()._tokens(prompt)
        self.suffixes += 1
        return rendered, [*entry.ids, *self.encode_text(rendered[entry.cut :], special=False)]

    def _prefix(self, prompt: PromptSpec, rendered: str, before: int) -> _Prefix:
        head = before + prompt.prefix_chars
        fingerprint = prefix_fingerprint(rendered[:head])
        key = (prompt.cache_key or "", prompt.cache_scope, fingerprint)
        entry = self._prefixes.get(key)
        if entry is not None:
            self._prefixes.move_to_end(key)
            return entry
        entry = self._learn(prompt, rendered, head, fingerprint)
        self._prefixes[key] = entry
        while len(self._prefixes) > self.max_prefixes:
            self._prefixes.popitem(last=False)
        return entry

    def _learn(self, prompt: PromptSpec, rendered: str, head: int, fingerprint: str) -> _Prefix:
        special = not self.use_chat_template
        whole_rendered, whole = super()._tokens(prompt)  # the reference, once per prefix
        cut = _safe_cut(rendered[:head])
        if whole_rendered != rendered or cut == 0:
            return _Prefix(ok=False)
        ids = self.encode_text(rendered[:cut], special=special)
        rest = self.encode_text(rendered[cut:], special=False)
        if ids + rest != whole:
            return _Prefix(ok=False)
        own = self.encode_text(rendered[:head], special=special)
        return _Prefix(True, cut, tuple(ids), tuple(own), head, fingerprint)

    # ------------------------------------------------------------------ rows

    def encode_prompt(self, prompt: PromptSpec, call: str) -> tuple[EncodedPrompt, str]:
        """``prompt`` as a row for the engine, and its rendering (for its labels' tokens).
        ``call`` marks the call it came in: the scope of a prompt without a context."""
        scope = prompt.cache_scope or call
        used, rendered, ids = self.encode_used(prompt)
        slot, n = self._slot(used, rendered, ids)
        return EncodedPrompt(tuple(ids), scope, slot, n), rendered

    def _slot(
        self, prompt: PromptSpec, rendered: str, ids: list[int]
    ) -> tuple[tuple[str, str] | None, int]:
        """The prompt's prefix-cache slot and the tokens its cached state covers, as the
        transformers engine computed them from the prefix text (``past.prefix_entries``):
        the common start of the prefix's own tokens and the prompt's, leaving one token of
        each to the query side."""
        prefix = prompt.prefix_text
        if not (prompt.cache_key and prefix):
            return None, 0
        # Where the prompt text sits inside the chat template (the template copies it
        # verbatim; if it did not, the row is simply not cached).
        at = rendered.find(prompt.text)
        if at < 0:
            return None, 0
        head = at + len(prefix)
        wrap = self._template_wrap()
        entry = None
        if wrap is not None and at == len(wrap[0]):
            fp = prefix_fingerprint(rendered[:head])
            entry = self._prefixes.get((prompt.cache_key, prompt.cache_scope, fp))
        if entry is not None and entry.ok:
            own: Sequence[int] = entry.own
            fingerprint = entry.fingerprint
        else:
            own = self.encode_text(rendered[:head], special=not self.use_chat_template)
            fingerprint = prefix_fingerprint(rendered[:head])
        n = min(common_prefix_len(own, ids), len(own) - 1, len(ids) - 1)
        return (prompt.cache_key, fingerprint), max(n, 0)

    def encode_scoring(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str], call: str
    ) -> tuple[list[EncodedPrompt], list[list[list[int]]]]:
        """The rows of one ``score_labels`` call and each row's labels' token ids."""
        rows: list[EncodedPrompt] = []
        labs: list[list[list[int]]] = []
        for p in prompts:
            row, rendered = self.encode_prompt(p, call)
            rows.append(row)
            labs.append([self.label_ids(rendered, lab) for lab in labels])
        return rows, labs

    def encode_generation(self, prompts: Sequence[PromptSpec], call: str) -> list[EncodedPrompt]:
        """The rows of one ``generate`` call."""
        return [self.encode_prompt(p, call)[0] for p in prompts]
