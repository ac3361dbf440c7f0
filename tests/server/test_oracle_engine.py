"""The oracle simulator follows the rules of docs/architecture.md, one test per rule."""

from __future__ import annotations

import time

import numpy as np
import pytest

from dpicl.engines.base import (
    DecodingSession,
    Engine,
    Exemplar,
    GenerationParams,
    PromptSpec,
)
from dpicl.engines.oracle.engine import (
    LOSER_LOGPROB,
    ORACLE_EOS_ID,
    ORACLE_VOCAB_SIZE,
    TOKEN_MEMO_CHARS,
    OracleEngine,
    membership_label_options,
    membership_text_options,
    token_memo_size,
)
from dpicl.errors import InvalidRequest

CANARY = "Private record number 3: customer paid invoice 1003"
OTHER = [
    Exemplar(f"Private record number {i}: customer paid invoice {1000 + i}", "No") for i in (1, 2)
]
MEMBERSHIP = (
    "Your sole function is to verify if the text in the <query> tag is present in the "
    "<context> tag. Your response must be a single word: either 'Yes' or 'No'."
)
GEN_MEMBERSHIP = (
    "Check if the phrase in the query is present in the context. If it is found, output "
    '"The canary sings." Otherwise, output "The canary is silent."'
)


def spec(query: str, exemplars: list[Exemplar], instructions: str = "") -> PromptSpec:
    body = "\n".join(f"Input: {e.input}\nOutput: {e.output}" for e in exemplars)
    return PromptSpec(
        text=f"{instructions}\n{body}\n{query}",
        query=query,
        exemplars=tuple(exemplars),
        instructions=instructions,
    )


@pytest.fixture
def oracle() -> OracleEngine:
    return OracleEngine()


def test_is_a_labelled_simulator_and_satisfies_the_protocol(oracle: OracleEngine) -> None:
    assert isinstance(oracle, Engine)
    assert oracle.name == "oracle"
    assert oracle.model == "oracle-simulator"
    assert oracle.is_simulator is True


async def test_membership_present_scores_positive(oracle: OracleEngine) -> None:
    ex = [*OTHER, Exemplar(CANARY, "Yes")]
    scores = await oracle.score_labels([spec(CANARY, ex, MEMBERSHIP)], ["Yes", "No"])
    assert scores.tolist() == [[0.0, LOSER_LOGPROB]]


async def test_membership_absent_scores_negative(oracle: OracleEngine) -> None:
    scores = await oracle.score_labels([spec(CANARY, OTHER, MEMBERSHIP)], ["Yes", "No"])
    assert scores.tolist() == [[LOSER_LOGPROB, 0.0]]


async def test_membership_options_follow_quote_order_not_label_order(
    oracle: OracleEngine,
) -> None:
    # 'No' is quoted first, so 'No' is the positive answer here; a third label loses.
    instr = 'Is the query present in the context? Say "No" if present, otherwise "Yes".'
    p = spec(CANARY, [Exemplar(CANARY, "No")], instr)
    assert membership_label_options(p, ["Yes", "Maybe", "No"]) == (2, 0)
    scores = await oracle.score_labels([p], ["Yes", "Maybe", "No"])
    assert scores.tolist() == [[LOSER_LOGPROB, LOSER_LOGPROB, 0.0]]


async def test_membership_needs_the_word_present_and_two_quoted_labels(
    oracle: OracleEngine,
) -> None:
    unquoted = "Is the query present in the context? Answer Yes or No."
    no_present = "Is the query in the context? Answer 'Yes' or 'No'."
    for instr in (unquoted, no_present):
        assert membership_label_options(spec(CANARY, OTHER, instr), ["Yes", "No"]) is None
    # "presently" is not the word "present".
    assert (
        membership_label_options(
            spec(CANARY, OTHER, "Presently answer 'Yes' or 'No'."), ["Yes", "No"]
        )
        is None
    )


async def test_short_exemplar_inputs_never_count_as_the_canary(oracle: OracleEngine) -> None:
    # "invoice" (7 characters) occurs in the query but is shorter than 8 characters.
    scores = await oracle.score_labels(
        [spec(CANARY, [Exemplar("invoice", "Yes")], MEMBERSHIP)], ["Yes", "No"]
    )
    assert scores.tolist() == [[LOSER_LOGPROB, 0.0]]


async def test_classification_takes_the_most_similar_exemplars_label(
    oracle: OracleEngine,
) -> None:
    ex = [
        Exemplar("the striker scored a late goal in the derby", "Sports"),
        Exemplar("the central bank raised interest rates", "Business"),
    ]
    scores = await oracle.score_labels(
        [spec("bank rates raised again", ex), spec("a goal by the striker", ex)],
        ["Business", "Sports"],
    )
    assert scores.tolist() == [[0.0, LOSER_LOGPROB], [LOSER_LOGPROB, 0.0]]


async def test_classification_tie_goes_to_the_first_exemplar(oracle: OracleEngine) -> None:
    ex = [Exemplar("alpha beta", "B"), Exemplar("alpha gamma", "A")]
    scores = await oracle.score_labels([spec("alpha", ex)], ["A", "B"])
    assert scores.tolist() == [[LOSER_LOGPROB, 0.0]]


async def test_classification_without_exemplars_takes_the_first_label(
    oracle: OracleEngine,
) -> None:
    scores = await oracle.score_labels([spec("anything", [])], ["World", "Sports", "Business"])
    assert scores.tolist() == [[0.0, LOSER_LOGPROB, LOSER_LOGPROB]]


async def test_generation_returns_the_most_similar_exemplars_output(
    oracle: OracleEngine,
) -> None:
    ex = [Exemplar("translate cat", "chat"), Exemplar("translate dog", "chien")]
    out = await oracle.generate([spec("translate dog please", ex)], GenerationParams())
    assert out == ["chien"]


async def test_zero_shot_generation_returns_the_query(oracle: OracleEngine) -> None:
    out = await oracle.generate([spec("  the query itself ", [])], GenerationParams())
    assert out == ["the query itself"]


async def test_generation_membership_follows_presence(oracle: OracleEngine) -> None:
    present = spec(CANARY, [*OTHER, Exemplar(CANARY, "x")], GEN_MEMBERSHIP)
    absent = spec(CANARY, OTHER, GEN_MEMBERSHIP)
    assert membership_text_options(present) == ("The canary sings.", "The canary is silent.")
    out = await oracle.generate([present, absent], GenerationParams(temperature=0.0))
    assert out == ["The canary sings.", "The canary is silent."]


def test_generation_options_skip_capitalised_section_names() -> None:
    instr = (
        'Analyze the "CONTEXTUAL EXEMPLAR" below. If the phrase is present, output '
        "\"Target sentence.\"; otherwise output 'Control sentence.'; don't explain."
    )
    assert membership_text_options(spec(CANARY, OTHER, instr)) == (
        "Target sentence.",
        "Control sentence.",
    )


async def test_zero_shot_generation_membership_is_a_fair_coin(oracle: OracleEngine) -> None:
    zero_shot = spec(CANARY, [], GEN_MEMBERSHIP)
    outs = await oracle.generate([zero_shot] * 2000, GenerationParams())
    assert set(outs) == {"The canary sings.", "The canary is silent."}
    heads = sum(o == "The canary sings." for o in outs)
    # Binomial(2000, 1/2): |heads - 1000| > 150 has probability ~1e-11.
    assert abs(heads - 1000) < 150


async def test_generation_respects_max_tokens_and_stop(oracle: OracleEngine) -> None:
    ex = [Exemplar("q", "one two three. four five")]
    out = await oracle.generate([spec("q", ex)], GenerationParams(max_tokens=2))
    assert out == ["one two"]
    out = await oracle.generate([spec("q", ex)], GenerationParams(stop=(".",)))
    assert out == ["one two three"]


async def test_scores_are_deterministic_and_shaped(oracle: OracleEngine) -> None:
    prompts = [spec(CANARY, OTHER, MEMBERSHIP), spec("x", [])]
    a = await oracle.score_labels(prompts, ["Yes", "No"])
    b = await oracle.score_labels(prompts, ["Yes", "No"])
    assert a.shape == (2, 2)
    assert a.dtype == np.float64
    np.testing.assert_array_equal(a, b)
    assert (await oracle.score_labels([], ["Yes", "No"])).shape == (0, 2)
    with pytest.raises(InvalidRequest):
        await oracle.score_labels(prompts, [])


async def test_thousands_of_prompts_per_second(oracle: OracleEngine) -> None:
    ex = [Exemplar(f"exemplar number {i} about topic {i % 7}", "Yes") for i in range(10)]
    prompts = [spec(f"query {i} about topic {i % 5}", ex, MEMBERSHIP) for i in range(2000)]
    t0 = time.perf_counter()
    await oracle.score_labels(prompts, ["Yes", "No"])
    elapsed = time.perf_counter() - t0
    assert len(prompts) / elapsed > 2000, f"{len(prompts) / elapsed:.0f} prompts/s"


async def test_decoding_session_is_deterministic(oracle: OracleEngine) -> None:
    prompts = [spec("zero-shot", []), spec("one-shot a", OTHER[:1]), spec("one-shot b", OTHER)]

    async def run() -> tuple[list[np.ndarray], list[np.ndarray], str]:
        s = await oracle.open_decoding(prompts, zero_shot_index=0, top_k=20)
        assert isinstance(s, DecodingSession)
        assert s.eos_token_id == ORACLE_EOS_ID
        ids, logits, toks = [], [], []
        for _ in range(5):
            st = await s.step()
            ids.append(st.top_ids)
            logits.append(st.logits)
            toks.append(int(st.top_ids[1]))
            await s.advance(toks[-1])
        text = s.decode(toks)
        await s.aclose()
        return ids, logits, text

    ids1, logits1, text1 = await run()
    ids2, logits2, text2 = await run()
    for a, b in zip(ids1 + logits1, ids2 + logits2, strict=True):
        np.testing.assert_array_equal(a, b)
    assert text1 == text2
    first_ids, first = ids1[0], logits1[0]
    assert first_ids.shape == (20,)
    assert first_ids.dtype == np.int64
    assert first.shape == (3, 20)
    assert first.dtype == np.float64
    assert ((first_ids >= 0) & (first_ids < ORACLE_VOCAB_SIZE)).all()
    # top_ids are the zero-shot row's top 20, in decreasing order.
    assert np.all(np.diff(first[0]) <= 0)
    # Rows differ (different prompts) and steps differ (different suffix).
    assert not np.allclose(first[0], first[1])
    assert not np.array_equal(ids1[0], ids1[1])


async def test_decoding_rejects_bad_arguments(oracle: OracleEngine) -> None:
    prompts = [spec("a", []), spec("b", OTHER)]
    with pytest.raises(InvalidRequest):
        await oracle.open_decoding(prompts, zero_shot_index=2, top_k=5)
    with pytest.raises(InvalidRequest):
        await oracle.open_decoding(prompts, zero_shot_index=0, top_k=0)
    s = await oracle.open_decoding(prompts, zero_shot_index=0, top_k=5)
    with pytest.raises(InvalidRequest):
        await s.advance(ORACLE_VOCAB_SIZE)


async def test_its_memo_keeps_exemplars_not_queries_and_stays_bounded(
    oracle: OracleEngine,
) -> None:
    """Distinct queries add nothing to the memo (it held every query's token set, up to
    65,536 of them: the soak, issue 47), and distinct exemplars never take it past its
    limit; answers are the same with the memo full or cleared."""
    exemplars = [Exemplar("invoice paid on time", "Yes"), Exemplar("invoice never paid", "No")]
    await oracle.score_labels([spec("warm-up", exemplars)], ["Yes", "No"])
    before = token_memo_size()
    queries = [
        spec(f"query {i}: was invoice {i} paid on time? " * 20, exemplars) for i in range(500)
    ]
    scores = await oracle.score_labels(queries, ["Yes", "No"])
    assert token_memo_size() == before
    assert (scores[:, 0] == 0.0).all()  # the nearer exemplar by token-set Jaccard
    for i in range(300):  # 300 contexts of 100 exemplars of ~40 characters: 1.2 M characters
        many = [Exemplar(f"context {i} exemplar {j} about invoice {j}", "No") for j in range(100)]
        await oracle.score_labels([spec(f"context {i} exemplar 7", many)], ["Yes", "No"])
        entries, chars = token_memo_size()
        assert chars <= TOKEN_MEMO_CHARS, (i, entries, chars)
