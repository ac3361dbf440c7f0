"""The limits probe's pure parts (auditor/dpicl_audit/probes/limits.py): the padded inputs,
the message normalisation, the ladder of query sizes, and the test's error and power.

The randomised test of the error simulates 400 runs of a server whose refusals do not depend
on the world (one request in ten refused at random, one of two messages); the test's error is
at most ALPHA = 1e-4 per run, so more than 2 flagged runs in 400 has probability below 1e-5
(Poisson, mean 0.04). The generator is seeded: the test is deterministic.
"""

from __future__ import annotations

import itertools

import numpy as np

from dpicl_audit.probes.limits import (
    ALPHA,
    FIELDS,
    MAX_SIZES,
    PER_SIZE,
    judge,
    normalise,
    padded,
    query_sizes,
)

OK = (200, "", "")
LONG = (422, "invalid_request", "the prompt of partition 2 has 20343 characters")


def test_padded_is_exact_keeps_the_text_and_ends_visible() -> None:
    for n in (1, 2, 63, 64, 65, 8000, 8001):
        got = padded("Investors cheered the plan.", n)
        assert len(got) == n and not got.endswith(" ")
        assert got.startswith("Investors cheered the plan."[:n])
    assert padded("q", 7) == "q a a a"


def test_normalise_removes_the_requests_own_ids_and_keeps_numbers() -> None:
    cid = "ctx_5f0c1d"
    msg = f"context {cid}: request 123e4567-e89b-12d3-a456-426614174000 has 20343 tokens"
    assert normalise(msg, cid) == "context <context>: request <id> has 20343 tokens"
    assert normalise("trace 0123456789abcdef0123", "x") == "trace <id>"


def test_query_sizes_reach_each_side_of_the_limit_in_steps_closer_than_the_gap() -> None:
    sizes = query_sizes(64, 8000, 20_000)
    assert sizes == [64, 2000, 4000, 6000, 7999, 8000, 8001]
    narrow = query_sizes(64, 8000, 1_000)
    assert {64, 7999, 8000, 8001} <= set(narrow) and len(narrow) <= MAX_SIZES
    assert max(b - a for a, b in itertools.pairwise(narrow)) < 1_000
    assert query_sizes(9000, 8000, 20_000) == [9000]  # a query above the limit: itself alone


def _sizes(
    one: list[tuple[int, str, str]], zero: list[tuple[int, str, str]], charged=(0, 0), n=7
) -> list:
    return [(64 + i, {1: one, 0: zero}, {1: charged[0], 0: charged[1]}) for i in range(n)]


def test_identical_outcomes_are_not_a_finding() -> None:
    found = judge(_sizes([OK] * PER_SIZE, [OK] * PER_SIZE))
    assert found is not None and found.p_value == 1.0
    assert found.tests == 8 * len(FIELDS)  # 7 sizes and the pooled one


def test_a_refusal_only_one_world_gets_is_a_finding_at_one_size() -> None:
    sizes = _sizes([OK] * PER_SIZE, [OK] * PER_SIZE)
    sizes[3] = (2000, {1: [LONG] * PER_SIZE, 0: [OK] * PER_SIZE}, {1: 0, 0: 0})
    found = judge(sizes)
    assert found is not None and found.p_value < ALPHA
    assert (found.size, found.field) == (2000, "refused")


def test_a_message_or_a_charge_that_depends_on_the_world_is_a_finding() -> None:
    other = (422, "invalid_request", "the prompt of partition 2 has 343 characters")
    found = judge(_sizes([LONG] * PER_SIZE, [other] * PER_SIZE, n=1))
    assert found is not None and found.p_value < ALPHA and found.field == "message"
    charged = judge(_sizes([LONG] * PER_SIZE, [LONG] * PER_SIZE, charged=(0, PER_SIZE), n=1))
    assert charged is not None and charged.p_value < ALPHA and charged.field == "charged"


def test_a_refusal_depending_on_the_world_half_the_time_is_found_pooled() -> None:
    half = [LONG] * (PER_SIZE // 2) + [OK] * (PER_SIZE // 2)
    found = judge(_sizes(half, [OK] * PER_SIZE))
    assert found is not None and found.p_value < ALPHA
    assert (found.size, found.field) == (None, "refused")


def test_world_independent_random_refusals_are_flagged_at_most_at_the_stated_rate() -> None:
    rng = np.random.default_rng(44)
    messages = ("the engine is busy", "try again later")

    def world() -> list[tuple[int, str, str]]:
        return [
            (422, "busy", messages[int(rng.integers(2))]) if rng.random() < 0.1 else OK
            for _ in range(PER_SIZE)
        ]

    flagged = 0
    for _ in range(400):
        sizes = [(64 + i, {1: world(), 0: world()}, {1: 0, 0: 0}) for i in range(7)]
        found = judge(sizes)
        flagged += found is not None and found.p_value < ALPHA
    assert flagged <= 2
