"""The OpenAI-compatible routes in process (the SDK tests are tests/e2e/test_openai_sdk.py):
the model listing's pages, OpenAI's error shape for failures outside the route (body limit,
bad JSON, wrong method), the charge rule of a streamed DPS-MOZO answer whose engine fails
before or after its first token, and a request's conversion to the native one (its context
loaded once)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dpicl.api.openai.protocol import ChatCompletionRequest, CompletionRequest, Query
from dpicl.engines.base import PromptSpec, StepLogits
from dpicl.engines.oracle.engine import OracleEngine
from dpicl.errors import InvalidRequest
from dpicl.web.schemas import ClassifyRequest, GenerateRequest
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context

MOZO = {
    "task": "generation",
    "exemplars": [{"input": f"Dialogue {i}", "output": f"Summary {i}."} for i in range(4)],
    "mechanism": {"name": "dps-mozo", "epsilon": 4.0, "n_shots": 2, "top_k": 20}
    | {"max_tokens": 12, "queries": 3},
}


class FailsAtStep:
    """A decoding session that fails at step ``fail_at`` (0: the first) and never ends."""

    def __init__(self, inner: Any, fail_at: int) -> None:
        self.inner, self.fail_at, self.steps = inner, fail_at, 0
        self.eos_token_id = inner.eos_token_id

    async def step(self) -> StepLogits:
        if self.steps == self.fail_at:
            raise RuntimeError("the model crashed")
        self.steps += 1
        out: StepLogits = await self.inner.step()
        logits = out.logits.copy()
        logits[:, out.top_ids == self.eos_token_id] = -1e4
        return StepLogits(top_ids=out.top_ids, logits=logits)

    async def advance(self, token_id: int) -> None:
        await self.inner.advance(token_id)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.inner.decode(token_ids))

    async def aclose(self) -> None:
        await self.inner.aclose()


class FailingDecoder(OracleEngine):
    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    async def open_decoding(  # type: ignore[override]
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> FailsAtStep:
        inner = await super().open_decoding(prompts, zero_shot_index=zero_shot_index, top_k=top_k)
        return FailsAtStep(inner, self.fail_at)


def _events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_engine_failure_mid_stream_keeps_the_charge(tmp_path: Path) -> None:
    with make_client(tmp_path, engine=FailingDecoder(fail_at=3)) as c:
        cid = c.post("/v1/contexts", json=MOZO, headers=admin_headers()).json()["id"]
        body = {"model": cid, "prompt": "Summarise.", "stream": True}
        with c.stream("POST", "/v1/completions", json=body, headers=user_headers()) as r:
            assert r.status_code == 200
            assert r.headers["x-dpicl-queries-remaining"] == "2"
            events = _events(r.read().decode())
        texts = [e for e in events[1:] if isinstance(e, dict) and "choices" in e]
        assert len(texts) == 3  # three tokens left before the failure
        assert events[-2]["error"]["code"] == "engine_unavailable"
        assert "stays charged" in events[-2]["error"]["message"]
        assert events[-1] == "[DONE]"
        spent = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()["spent"]
        assert spent["queries"] == 1  # tokens left: the answer stays charged


def test_engine_failure_before_the_first_token_is_refunded(tmp_path: Path) -> None:
    with make_client(tmp_path, engine=FailingDecoder(fail_at=0)) as c:
        cid = c.post("/v1/contexts", json=MOZO, headers=admin_headers()).json()["id"]
        body = {"model": cid, "messages": [{"role": "user", "content": "q"}], "stream": True}
        r = c.post("/v1/chat/completions", json=body, headers=user_headers())
        # The charge's headers went out (the stream had started) but no token did.
        assert r.status_code == 200
        events = _events(r.text)
        assert events[-2]["error"]["code"] == "engine_unavailable"
        assert "nothing was charged" in events[-2]["error"]["message"]
        spent = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()["spent"]
        assert spent["queries"] == 0


def test_model_pages_and_errors_in_openai_shape(tmp_path: Path) -> None:
    with make_client(tmp_path, max_body_bytes=4096) as c:
        ids = [
            c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
            for _ in range(3)
        ]
        page = c.get("/v1/models?limit=2", headers=user_headers()).json()
        assert [m["id"] for m in page["data"]] == ids[:2] and page["has_more"] is True
        assert page["last_id"] == ids[1]
        rest = c.get(f"/v1/models?limit=2&after={page['last_id']}", headers=user_headers()).json()
        assert [m["id"] for m in rest["data"]] == ids[2:] and rest["has_more"] is False
        for r, status, param in [
            (c.get("/v1/models?after=ctx_nope", headers=user_headers()), 400, "after"),
            # The form of an id, naming no model: 404, as the model itself would be.
            (c.get(f"/v1/models?after=ctx_{'0' * 24}", headers=user_headers()), 404, "after"),
            (c.get("/v1/models?limit=0", headers=user_headers()), 400, "limit"),
            (c.put("/v1/models", headers=user_headers()), 405, None),
            (
                c.post(
                    "/v1/completions",
                    content=b"{not json",
                    headers=user_headers() | {"content-type": "application/json"},
                ),
                400,
                None,
            ),
            (
                c.post(
                    "/v1/completions",
                    json={"model": ids[0], "prompt": "x" * 5000},
                    headers=user_headers(),
                ),
                413,
                None,
            ),
            (c.get("/v1/models/nope", headers=user_headers()), 404, "model"),
        ]:
            assert r.status_code == status, r.text
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}, err
            assert err["param"] == param
        # The native routes keep their own shape.
        r = c.get("/v1/contexts?limit=0", headers=admin_headers())
        assert r.status_code == 422 and set(r.json()["error"]) == {"code", "message", "param"}


def test_a_request_loads_its_context_once(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        repo = c.app.state.services.repo  # type: ignore[attr-defined]
        loads: list[str] = []
        get_for_query = repo.get_for_query

        async def counted(context_id: str, **kwargs: Any) -> Any:
            loads.append(context_id)
            return await get_for_query(context_id, **kwargs)

        repo.get_for_query = counted
        chat = {"model": cid, "messages": [{"role": "user", "content": "Is it?"}]}
        for path, body in [
            ("/v1/chat/completions", chat),
            ("/v1/chat/completions", chat | {"stream": True}),
            ("/v1/completions", {"model": cid, "prompt": "Is it?"}),
        ]:
            loads.clear()
            r = c.post(path, json=body, headers=user_headers())
            assert r.status_code == 200, r.text
            assert loads == [cid], path
        # The native route, for comparison, loads it once too.
        loads.clear()
        r = c.post(
            "/v1/classify", json={"context_id": cid, "query": "Is it?"}, headers=user_headers()
        )
        assert r.status_code == 200 and loads == [cid]


def test_a_request_converts_itself_to_the_native_request() -> None:
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "ctx_x",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 7,
        }
    )
    query = chat.query()
    assert query == Query("a\nb", "messages.1.content")
    assert chat.to_native("generation", query) == GenerateRequest(
        context_id="ctx_x", query="a\nb", max_tokens=7
    )
    assert chat.to_native("classification", query) == ClassifyRequest(
        context_id="ctx_x", query="a\nb"
    )
    text = CompletionRequest.model_validate({"model": "ctx_x", "prompt": ["q"]})
    native = text.to_native("generation", text.query())
    assert isinstance(native, GenerateRequest) and "max_tokens" not in native.model_fields_set
    # The native request's own checks, named in OpenAI's terms.
    blank = CompletionRequest.model_validate({"model": "ctx_x", "prompt": " \u200b"})
    with pytest.raises(InvalidRequest, match=r"^prompt: the query must contain a visible") as e:
        blank.to_native("classification", blank.query())
    assert e.value.param == "prompt"


def test_the_last_user_message_is_the_query_whatever_follows_it(tmp_path: Path) -> None:
    """What the published schema says (issue 39): a conversation with a user message is
    answered, even when a tool's or an assistant's message follows it; one without is not."""
    with make_client(tmp_path) as c:
        cid = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        tail = [
            {"role": "user", "content": "Is it?"},
            {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "Thinking"},
        ]
        r = c.post(
            "/v1/chat/completions", json={"model": cid, "messages": tail}, headers=user_headers()
        )
        assert r.status_code == 200, r.text
        none = [{"role": "tool", "content": "42"}]
        r = c.post(
            "/v1/chat/completions", json={"model": cid, "messages": none}, headers=user_headers()
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
        r = c.post("/v1/completions", json={"model": cid, "prompt": None}, headers=user_headers())
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_the_published_schema_says_what_is_accepted(tmp_path: Path) -> None:
    """The OpenAPI document refuses what the server refuses (issue 39): a null prompt, a
    conversation without a user message, a model cursor that is not a model id, a key with
    both scopes (or neither)."""
    import jsonschema

    with make_client(tmp_path) as c:
        doc = c.get("/openapi.json").json()

    def valid(name: str, body: Any) -> bool:
        schema = {**doc["components"]["schemas"][name], "components": doc["components"]}
        try:
            jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
        except jsonschema.ValidationError:
            return False
        return True

    cid = "ctx_" + "0" * 24
    assert valid("CompletionRequest", {"model": cid, "prompt": "q"})
    assert valid("CompletionRequest", {"model": cid, "prompt": ["q"]})
    for prompt in (None, [], ["a", "b"], [1, 2], "   "):
        assert not valid("CompletionRequest", {"model": cid, "prompt": prompt}), prompt
    user = {"role": "user", "content": "q"}
    tool = {"role": "tool", "content": "x"}
    assert valid("ChatCompletionRequest", {"model": cid, "messages": [user, tool]})
    assert not valid("ChatCompletionRequest", {"model": cid, "messages": [tool]})
    assert not valid("ChatCompletionRequest", {"model": cid, "messages": [{"role": "user"}]})
    assert valid("KeySpec", {"tenant": "acme"})
    assert valid("KeySpec", {"contexts": [cid]})
    assert valid("KeySpec", {"tenant": None, "contexts": [cid]})
    assert not valid("KeySpec", {"tenant": "acme", "contexts": [cid]})
    assert not valid("KeySpec", {})
    models = doc["paths"]["/v1/models"]["get"]["parameters"]
    after = next(p for p in models if p["name"] == "after")
    assert re.fullmatch(after["schema"]["anyOf"][0]["pattern"].strip("^$"), cid)
