"""Issue 35, items 1 and 2 on every answering route (probes/surface.py): headers, stream
chunk metadata, ``usage`` and ``finish_reason`` tested for dependence on the world given the
answer, the public cost headers against the body's figures, and DPS-MOZO's ``max_tokens``
above the context's limit.

The real app runs in this process (oracle engine, production configuration), one fault of
``tests/e2e/broken_surface_server.py`` patched in (and its ASGI wrapper where it has one).
The honest runs' exit 0 fails only where a correct server reads VIOLATION, BUG or
NONCONFORMING: the surface probe's dependence test is held to 1e-4 per run (Bonferroni), the
run's other tests to 5% and 1e-4; the limit and cost checks are deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from dpicl_audit.probes.answers import read_answer
from dpicl_audit.probes.surface import public_departures
from dpicl_audit.results import results_exit_code
from tests.e2e import broken_surface_server as surface
from tests.e2e.test_surface_faults import _audit, _audit_behind
from tests.findings import findings

ONE = {"mechanism.epsilons": [4.0], "trials": 100, "seed": 12}


@pytest.mark.parametrize(
    ("fault", "wrap", "field"),
    [
        (None, None, None),
        ("prompt_tokens", None, "usage.prompt_tokens"),
        ("context_version", surface.version_app, "header x-dpicl-context-version"),
    ],
)
async def test_a_field_of_any_route_that_tells_the_worlds_apart_is_a_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None, wrap: Any, field: Any
) -> None:
    """The native trials never see the OpenAI routes' usage or any header; the surface
    probe does, and names the route and field. The honest server's every field (chunk
    counts, finish reasons, usage zeros, dpicl's task) is independent of the world."""
    res, left = await _audit_behind(
        tmp_path, monkeypatch, fault, wrap or (lambda app: app), flags=ONE
    )
    found = res["surface"]
    assert left == []
    assert [r["route"] for r in found["routes"]] == [
        "native", "chat", "completions", "chat-stream", "completions-stream"
    ]  # fmt: skip
    if fault is None:
        assert found["status"] == "ok" and found["public"] == [], found["message"]
        assert results_exit_code([res]) == 0, findings(res)
    else:
        assert found["status"] == "violation", found["message"]
        assert found["field"].endswith(field), found["field"]
        assert results_exit_code([res]) == 5


def _streamed(events: list[str], headers: dict[str, str]) -> httpx.Response:
    body = "".join(f"data: {e}\n\n" for e in [*events, "[DONE]"])
    return httpx.Response(200, headers=headers | {"content-type": "text/event-stream"}, text=body)


def test_a_streamed_answer_read_whole() -> None:
    """The answer is the chunks' text; the chunk count, the closing and usage chunks'
    fields and the other headers are fields; the cost headers are public, and one that is not
    the body's figure is a departure naming it."""
    closing = (
        '{"choices":[{"index":0,"finish_reason":"length","delta":{}}],"dpicl":{"task":"generation",'
        '"cost":{"epsilon":1.5,"delta":1e-5},"budget":{"spent_epsilon":1.5}}}'
    )
    events = [
        '{"choices":[{"index":0,"finish_reason":null,"delta":{"role":"assistant","content":""}}]}',
        '{"choices":[{"index":0,"finish_reason":null,"delta":{"content":" red"}}]}',
        '{"choices":[{"index":0,"finish_reason":null,"delta":{"content":" car"}}]}',
        closing,
        '{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":2,"total_tokens":2}}',
    ]
    headers = {"x-dpicl-epsilon-spent": "1.5", "x-request-id": "abc", "x-shard": "7"}
    got = read_answer("chat-stream", _streamed(events, headers))
    assert got["answer"] == " red car" and got["tokens"] == 2
    fields = got["fields"]
    assert fields["stream chunks"] == 5 and fields["header x-shard"] == 7.0
    assert fields["stream closing choices.0.finish_reason"] == "length"
    assert fields["stream usage usage.completion_tokens"] == 2
    assert not any("request-id" in k or "content" in k for k in fields)
    assert got["public"]["x-dpicl-epsilon-spent"] == "1.5" == str(got["public"]["cost.epsilon"])
    assert public_departures("chat-stream", [(1, got), (0, got)]) == []
    lying = dict(got, public=got["public"] | {"x-dpicl-epsilon-spent": "0.5"})
    (found,) = public_departures("chat-stream", [(1, lying)])
    assert "x-dpicl-epsilon-spent" in found and "cost.epsilon" in found
    dearer = dict(got, public=got["public"] | {"cost.epsilon": 3.0, "x-dpicl-epsilon-spent": "3"})
    assert any("the cost" in f for f in public_departures("chat-stream", [(1, got), (0, dearer)]))


MOZO = {"mechanism.name": "dps-mozo", "mechanism.epsilons": [4.0], "trials": 40, "seed": 6}


@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, "mozo_no_token_limit"])
@pytest.mark.long
async def test_mozo_max_tokens_above_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None
) -> None:
    """DPS-MOZO at the defaults (T_max 2): max_tokens 3 and 8 are refused by the honest
    server on every route (its answers at max_tokens 1 have one token); one that answers
    them with every token asked for is a BUG naming the route."""
    res, left = await _audit(tmp_path, fault, monkeypatch, **MOZO)
    found = res["surface"]
    assert left == [] and found["limit"] == 2
    if fault is None:
        assert found["status"] == "ok", found["message"]
        for r in found["routes"]:
            assert [a["outcome"][:7] for a in r["above_limit"]] == ["refused"] * 2, r
        assert results_exit_code([res]) == 0, findings(res)
    else:
        assert found["status"] == "bug", found
        assert "above the context's limit 2 answered with 8 tokens" in found["message"]
        assert results_exit_code([res]) == 5
