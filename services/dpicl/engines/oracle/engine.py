"""The oracle: a deterministic, rule-following stand-in for an ideal LLM (a *simulator*).

It exists for fast tests and for checking that an audit is tight when the "model" obeys
its instructions perfectly. It is labelled a simulator everywhere (``is_simulator``,
``model = "oracle-simulator"``) and is never the default engine. The rules are those of
docs/architecture.md, "The oracle simulator's rules"; in short:

* membership prompts ("is this text present?") are answered with the positive option
  exactly when some exemplar's input occurs verbatim in the query; a zero-shot generation
  membership prompt flips a fair coin drawn from OS entropy (the only randomness here);
* classification prompts get the label of the most similar exemplar (token-set Jaccard);
* generation prompts get the output of the most similar exemplar, or the query itself
  when there are no exemplars;
* decoding sessions produce pseudo-logits over a 512-token toy vocabulary (id 0 is EOS)
  from a hash of (prompt text, suffix ids), so the DPS-MOZO mechanics are reproducible.

Everything is pure Python and runs inline (no worker thread): thousands of prompts per
second.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence

import numpy as np

from dpicl.engines.base import (
    Exemplar,
    FloatArray,
    GenerationParams,
    PromptSpec,
    StepLogits,
)
from dpicl.errors import InvalidRequest

__all__ = [
    "LOSER_LOGPROB",
    "ORACLE_EOS_ID",
    "ORACLE_VOCAB",
    "ORACLE_VOCAB_SIZE",
    "OracleDecodingSession",
    "OracleEngine",
    "canary_present",
    "decode_oracle_tokens",
    "membership_label_options",
    "membership_text_options",
    "most_similar_exemplar",
]

LOSER_LOGPROB = -30.0
MIN_CANARY_CHARS = 8

ORACLE_VOCAB_SIZE = 512
ORACLE_EOS_ID = 0
# A toy vocabulary: EOS, the 95 printable ASCII characters, then pseudo-words.
ORACLE_VOCAB: tuple[str, ...] = (
    "",
    *(chr(c) for c in range(32, 127)),
    *(f" w{i}" for i in range(96, ORACLE_VOCAB_SIZE)),
)
_LOGIT_SCALE = 2.0
_EOS_BASE = -3.0
_EOS_PER_TOKEN = 0.25

_PRESENT = re.compile(r"\bpresent\b", re.IGNORECASE)
_WORD = re.compile(r"\w+")
_ASKED_AFTER = re.compile(r"\s*is\s+(?:not\s+)?(?:present|found)\b", re.IGNORECASE)
# Quoted strings: "..", “..”, and '..' / ‘..’ not glued to a word (so "don't" is no quote).
_QUOTED = (
    re.compile(r'"([^"\n]*)"'),
    re.compile(r"“([^”\n]*)”"),
    re.compile(r"(?<![\w'])'([^'\n]*)'(?![\w'])"),
    re.compile(r"‘([^’\n]*)’"),
)
_QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("“", "”"), ("‘", "’"))


#: Characters of exemplar text whose token sets are memoised: about 10 MB at most with
#: their sets (measured with tracemalloc: 8,367 texts of ~30 characters held 8.8 MB, 330
#: of ~790 characters and 100 words 4.7 MB). Every query of a context compares with the
#: same exemplars, so theirs are worth keeping; a query's are not (queries seldom repeat).
#: The memo was keyed by every text, queries included: 65,536 entries of up to 8,000
#: characters each, filling with each distinct query (found by the soak, issue 47). Past
#: the limit it starts over: simple, and a context larger than the limit is only
#: tokenised again.
TOKEN_MEMO_CHARS = 250_000
_token_memo: dict[str, frozenset[str]] = {}
_token_memo_chars = 0


def _tokens(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def _exemplar_tokens(text: str) -> frozenset[str]:
    """``_tokens`` of an exemplar's input, memoised (:data:`TOKEN_MEMO_CHARS`). The oracle
    runs inline on the event loop (one thread), so the memo needs no lock."""
    global _token_memo_chars
    hit = _token_memo.get(text)
    if hit is None:
        hit = _tokens(text)
        if _token_memo_chars + len(text) > TOKEN_MEMO_CHARS:
            _token_memo.clear()
            _token_memo_chars = 0
        _token_memo[text] = hit
        _token_memo_chars += len(text)
    return hit


def token_memo_size() -> tuple[int, int]:
    """The exemplar-token memo's (entries, characters): at most :data:`TOKEN_MEMO_CHARS`
    characters (plus one text longer than the limit)."""
    return len(_token_memo), _token_memo_chars


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 0.0
    return len(a & b) / len(a | b)


def most_similar_exemplar(query: str, exemplars: Sequence[Exemplar]) -> Exemplar | None:
    """The exemplar whose input has the largest token-set Jaccard similarity with the
    query (lower-cased ``\\w+`` tokens); the first one wins a tie; ``None`` if none."""
    if not exemplars:
        return None
    q = _tokens(query)
    best, best_sim = exemplars[0], -1.0
    for e in exemplars:
        sim = _jaccard(q, _exemplar_tokens(e.input))
        if sim > best_sim:
            best, best_sim = e, sim
    return best


def canary_present(prompt: PromptSpec) -> bool:
    """Whether some exemplar's input (stripped, at least 8 characters) occurs verbatim in
    the query."""
    return any(
        len(s := e.input.strip()) >= MIN_CANARY_CHARS and s in prompt.query
        for e in prompt.exemplars
    )


def _asks_presence(prompt: PromptSpec) -> bool:
    return bool(_PRESENT.search(prompt.instructions) or _PRESENT.search(prompt.query))


def _asked_text(prompt: PromptSpec) -> str:
    return f"{prompt.instructions}\n{prompt.query}"


def membership_label_options(prompt: PromptSpec, labels: Sequence[str]) -> tuple[int, int] | None:
    """(positive, negative) label indices when ``prompt`` is a membership prompt over
    ``labels``: it asks whether something is "present" and at least two labels appear
    quoted in instructions + query; positive and negative are the first two quoted labels
    in order of first appearance. ``None`` otherwise."""
    if not _asks_presence(prompt):
        return None
    text = _asked_text(prompt)
    found: list[tuple[int, int]] = []
    for j, label in enumerate(labels):
        positions = [p for a, b in _QUOTE_PAIRS if (p := text.find(f"{a}{label}{b}")) >= 0]
        if positions:
            found.append((min(positions), j))
    if len(found) < 2:
        return None
    found.sort()
    return found[0][1], found[1][1]


def _is_header(s: str) -> bool:
    letters = [c for c in s if c.isalpha()]
    return bool(letters) and all(c.isupper() for c in letters) and len(letters) > 1


def membership_text_options(prompt: PromptSpec) -> tuple[str, str] | None:
    """(positive, negative) option strings when ``prompt`` is a generation membership
    prompt: it asks whether something is "present" and instructions + query hold at least
    two distinct quoted option strings. Options are the first two distinct quoted strings
    in order of appearance, skipping empty ones and all-capitals section names such as
    "CONTEXTUAL EXEMPLAR". ``None`` otherwise."""
    if not _asks_presence(prompt):
        return None
    text = _asked_text(prompt)
    hits: list[tuple[int, str]] = []
    asked: set[str] = set()
    for pattern in _QUOTED:
        for m in pattern.finditer(text):
            hits.append((m.start(), m.group(1).strip()))
            # The text whose presence is asked about ('"<canary>" is present', '... is
            # found') is the subject of the question, not an answer option.
            if _ASKED_AFTER.match(text, m.end()):
                asked.add(m.group(1).strip())
    hits.sort()
    options: list[str] = []
    for _, s in hits:
        if s and s not in asked and not _is_header(s) and s not in options:
            options.append(s)
            if len(options) == 2:
                return options[0], options[1]
    return None


def _label_index(output: str, labels: Sequence[str]) -> int:
    if output in labels:
        return list(labels).index(output)
    key = output.strip().casefold()
    for j, label in enumerate(labels):
        if label.strip().casefold() == key:
            return j
    return 0


def _truncate(text: str, params: GenerationParams) -> str:
    for s in params.stop:
        if s and (cut := text.find(s)) >= 0:
            text = text[:cut]
    words = text.split()
    if len(words) > params.max_tokens:
        text = " ".join(words[: params.max_tokens])
    return text.strip()


def decode_oracle_tokens(token_ids: Sequence[int]) -> str:
    """The text of the oracle's token ids (a plain function: it crosses to a server process,
    :mod:`dpicl.engines.process.engine`, by reference)."""
    return "".join(ORACLE_VOCAB[int(i)] for i in token_ids if 0 < int(i) < ORACLE_VOCAB_SIZE)


class OracleEngine:
    """The rule-following simulator (see module docstring and docs/architecture.md)."""

    name: str = "oracle"
    model: str = "oracle-simulator"
    is_simulator: bool = True

    def __init__(self) -> None:
        self.eos_token_id = ORACLE_EOS_ID
        self.vocab_size = ORACLE_VOCAB_SIZE

    # The rules, synchronous and public so tests and benchmarks can call them directly.

    def score_one(self, prompt: PromptSpec, labels: Sequence[str]) -> list[float]:
        row = [LOSER_LOGPROB] * len(labels)
        options = membership_label_options(prompt, labels)
        if options is not None:
            positive, negative = options
            row[positive if canary_present(prompt) else negative] = 0.0
            return row
        best = most_similar_exemplar(prompt.query, prompt.exemplars)
        row[0 if best is None else _label_index(best.output, labels)] = 0.0
        return row

    def generate_one(self, prompt: PromptSpec) -> str:
        options = membership_text_options(prompt)
        if options is not None:
            if not prompt.exemplars:
                # Zero-shot candidate: a fair coin from OS entropy (Prompt 2 of paper 000).
                return options[secrets.randbelow(2)]
            return options[0] if canary_present(prompt) else options[1]
        best = most_similar_exemplar(prompt.query, prompt.exemplars)
        return prompt.query if best is None else best.output

    # The Engine protocol.

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> FloatArray:
        if not labels:
            raise InvalidRequest("at least one label is needed", param="labels")
        out = np.array([self.score_one(p, labels) for p in prompts], dtype=np.float64)
        return out.reshape(len(prompts), len(labels))

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        params.check()
        return [_truncate(self.generate_one(p), params) for p in prompts]

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> OracleDecodingSession:
        if not prompts:
            raise InvalidRequest("a decoding session needs at least one prompt")
        if not 0 <= zero_shot_index < len(prompts):
            raise InvalidRequest(
                f"zero_shot_index {zero_shot_index} is out of range for {len(prompts)} prompts"
            )
        if top_k < 1:
            raise InvalidRequest(f"top_k must be >= 1, got {top_k}", param="top_k")
        return OracleDecodingSession(
            [p.text for p in prompts],
            zero_shot_index=zero_shot_index,
            top_k=min(top_k, ORACLE_VOCAB_SIZE),
        )

    async def aclose(self) -> None:
        return None


class OracleDecodingSession:
    """Pseudo-logits from a hash of (prompt text, suffix ids).

    Row i's logits are ``2 * N(0, 1)`` draws from a generator seeded with
    ``blake2b(text_i, suffix)``, plus an EOS bias of ``-3 + 0.25 * len(suffix)`` on id 0, so
    sequences end after a few dozen tokens. Identical inputs give identical logits in every
    process.
    """

    def __init__(self, texts: list[str], *, zero_shot_index: int, top_k: int) -> None:
        self.eos_token_id: int = ORACLE_EOS_ID
        self.zero_shot_index = zero_shot_index
        self.top_k = top_k
        self.suffix: list[int] = []
        self._hashes = [hashlib.blake2b(t.encode("utf-8"), digest_size=32) for t in texts]
        self._logits = self._compute()

    def _compute(self) -> FloatArray:
        rows = np.empty((len(self._hashes), ORACLE_VOCAB_SIZE), dtype=np.float64)
        for i, h in enumerate(self._hashes):
            seed = int.from_bytes(h.copy().digest(), "little")
            rows[i] = _LOGIT_SCALE * np.random.default_rng(seed).standard_normal(ORACLE_VOCAB_SIZE)
        rows[:, ORACLE_EOS_ID] += _EOS_BASE + _EOS_PER_TOKEN * len(self.suffix)
        return rows

    async def step(self) -> StepLogits:
        z = self._logits[self.zero_shot_index]
        top = np.argsort(-z, kind="stable")[: self.top_k].astype(np.int64)
        return StepLogits(top_ids=top, logits=self._logits[:, top].copy())

    async def advance(self, token_id: int) -> None:
        tok = int(token_id)
        if not 0 <= tok < ORACLE_VOCAB_SIZE:
            raise InvalidRequest(f"token id {tok} is outside the oracle's vocabulary")
        self.suffix.append(tok)
        marker = tok.to_bytes(4, "little")
        for h in self._hashes:
            h.update(marker)
        self._logits = self._compute()

    def decode(self, token_ids: Sequence[int]) -> str:
        return decode_oracle_tokens(token_ids)

    async def aclose(self) -> None:
        return None
