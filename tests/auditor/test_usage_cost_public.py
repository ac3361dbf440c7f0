"""``usage.dpicl`` (issue 39: the cost and budget inside ``usage``) is public by design: never
tested for dependence on the world (an honest OpenAI-route audit read a VIOLATION on
``usage.dpicl.queries_remaining``, which follows each world's own budget), and checked
against the body's figures instead, a departure named."""

from __future__ import annotations

import json
from typing import Any

import httpx

from dpicl_audit.estimators.extra_fields import response_fields
from dpicl_audit.probes.answers import read_answer
from dpicl_audit.probes.surface import public_departures


def _chat(usage_cost: dict[str, Any], remaining: int = 3) -> httpx.Response:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Yes"},
            }
        ],
        "usage": {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 0,
            "dpicl": usage_cost,
        },
        "dpicl": {
            "task": "classification",
            "cost": {"epsilon": 1.5, "delta": 1e-5},
            "budget": {"spent_epsilon": 3.0, "delta": 1e-5, "remaining_queries": remaining},
        },
    }
    return httpx.Response(200, text=json.dumps(body), headers={"x-dpicl-epsilon-spent": "1.5"})


def _usage(epsilon: float = 1.5, remaining: int = 3) -> dict[str, Any]:
    return {
        "epsilon_spent": epsilon,
        "delta_spent": 1e-5,
        "context_epsilon_spent": 3.0,
        "delta": 1e-5,
        "epsilon_remaining": None,
        "queries_remaining": remaining,
    }


def test_usage_cost_is_public_not_a_field() -> None:
    fields = response_fields(json.loads(_chat(_usage()).text))
    assert not [k for k in fields if k.startswith("usage.dpicl")], fields
    assert "usage.completion_tokens" in fields  # the rest of usage is still tested
    got = read_answer("chat", _chat(_usage()))
    assert got["public"]["usage.dpicl.queries_remaining"] == 3
    assert not [k for k in got["fields"] if "usage.dpicl" in k]


def test_usage_cost_equal_to_the_body_is_no_departure() -> None:
    answers = [(1, read_answer("chat", _chat(_usage(remaining=3), 3))),
               (0, read_answer("chat", _chat(_usage(remaining=1), 1)))]  # fmt: skip
    assert public_departures("chat", answers) == []


def test_usage_cost_unlike_the_body_is_named() -> None:
    answers = [(1, read_answer("chat", _chat(_usage(epsilon=0.5))))]
    found = public_departures("chat", answers)
    assert any("usage.dpicl.epsilon_spent 0.5" in f and "cost.epsilon 1.5" in f for f in found)
    wrong_queries = [(0, read_answer("chat", _chat(_usage(remaining=9), 3)))]
    assert any(
        "usage.dpicl.queries_remaining" in f for f in public_departures("chat", wrong_queries)
    )
