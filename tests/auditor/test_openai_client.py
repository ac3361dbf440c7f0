"""The auditor's OpenAI-surface client and context hooks, over httpx.MockTransport: what it
sends (chat completions with the key, the query as the one user message), what it reads
(choices, dpicl's extension), how it maps OpenAI-shaped errors, and the two hook forms."""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx
import pytest

from dpicl_audit.client import GenerationTarget
from dpicl_audit.client.context_hook import context_info, load_hook
from dpicl_audit.client.openai import OpenAIClient
from dpicl_audit.errors import (
    InvalidPlan,
    TargetBudgetExhausted,
    TargetNotFound,
    TargetProtocolError,
)
from dpicl_audit.plan import AuditPlan

BODY: dict[str, Any] = {
    "name": "dpicl-audit r1 eps=4 C1",
    "task": "classification",
    "labels": ["Yes", "No"],
    "template": "{exemplars} {query}",
    "exemplars": [{"input": "a", "output": "Yes"}, {"input": "b", "output": "No"}],
    "mechanism": {"name": "voting", "epsilon": 4.0, "partitions": 2},
    "budget": None,
}


def _openai_error(status: int, code: str, param: str | None = None) -> httpx.Response:
    err = {"message": "m", "type": "invalid_request_error", "param": param, "code": code}
    return httpx.Response(status, json={"error": err})


def _client(handler: Any, **kw: Any) -> OpenAIClient:
    return OpenAIClient(
        "http://gw.test",
        admin_token="adm",
        api_key="usr",
        retries=0,
        transport=httpx.MockTransport(handler),
        **kw,
    )


async def test_queries_are_chat_completions_read_from_choices() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append({"path": request.url.path, "auth": request.headers["authorization"]} | body)
        ext = {"cost": {"epsilon": 4.0}, "budget": {"queries": 1}, "engine": "oracle"}
        message = {"role": "assistant", "content": "Yes"}
        return httpx.Response(200, json={"choices": [{"message": message}], "dpicl": ext})

    client = _client(handler)
    assert isinstance(client, GenerationTarget)
    out = await client.classify("ctx_1", "is it present?")
    assert out["label"] == "Yes" and out["cost"] == {"epsilon": 4.0}
    gen = await client.generate("ctx_2", "summarise", max_tokens=5)
    assert gen["text"] == "Yes"
    assert seen[0] == {
        "path": "/v1/chat/completions",
        "auth": "Bearer usr",
        "model": "ctx_1",
        "messages": [{"role": "user", "content": "is it present?"}],
    }
    assert seen[1]["max_tokens"] == 5 and seen[1]["model"] == "ctx_2"
    with pytest.raises(TargetProtocolError, match="--api native"):
        await client.debug_classify("ctx_1", "q")
    await client.aclose()


async def test_errors_and_malformed_answers() -> None:
    answers = iter(
        [
            _openai_error(402, "budget_exhausted", "model"),
            _openai_error(429, "budget_exhausted", "model"),  # servers before issue 39
            _openai_error(404, "model_not_found", "model"),
            httpx.Response(200, json={"choices": []}),
            httpx.Response(200, json={"choices": [{"message": {"content": None}}]}),
        ]
    )
    client = _client(lambda r: next(answers))
    for _ in range(2):
        with pytest.raises(TargetBudgetExhausted):
            await client.classify("ctx_1", "q")
    with pytest.raises(TargetNotFound) as nf:
        await client.classify("ctx_1", "q")
    assert nf.value.code == "model_not_found" and nf.value.param == "model"
    for _ in range(2):
        with pytest.raises(TargetProtocolError, match=r"choices|non-text"):
            await client.classify("ctx_1", "q")
    await client.aclose()


def make_context(body: dict[str, Any]) -> dict[str, Any]:
    """An entry-point hook (tests name it ``tests.auditor.test_openai_client:make_context``)."""
    return {"id": f"model-{len(body['exemplars'])}", "mechanism": {"sigma": 1.5}}


async def test_entry_point_hook_creates_contexts_without_the_admin_api() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200, json={"id": "model-2", "object": "model"})

    hook = load_hook("tests.auditor.test_openai_client:make_context", timeout=10)
    client = _client(handler, hook=hook)
    info = await client.create_context(BODY)
    assert info["id"] == "model-2" and info["n_exemplars"] == 2
    assert info["mechanism"] == {"name": "voting", "epsilon": 4.0, "partitions": 2, "sigma": 1.5}
    assert info["labels"] == ["Yes", "No"] and "exemplars" not in info
    assert (await client.get_context("model-2"))["id"] == "model-2"
    assert await client.list_contexts() == []
    await client.delete_context("model-2")  # the deployment is its operator's: no request
    assert paths == ["/v1/models/model-2"]
    await client.aclose()


async def test_command_hook_reads_the_body_and_answers_a_model_id(tmp_path: Any) -> None:
    script = tmp_path / "hook.py"
    script.write_text(
        "import json, sys\nbody = json.load(sys.stdin)\n"
        "print('creating', body['name'])\nprint('model-' + str(len(body['exemplars'])))\n"
    )
    hook = load_hook(f"{sys.executable} {script}", timeout=30)
    info = await hook(BODY)
    assert info["id"] == "model-2" and info["mechanism"]["epsilon"] == 4.0
    failing = tmp_path / "fail.py"
    failing.write_text("import sys\nsys.exit('no capacity')\n")
    with pytest.raises(TargetProtocolError, match="status 1: no capacity"):
        await load_hook(f"{sys.executable} {failing}", timeout=30)(BODY)
    with pytest.raises(TargetProtocolError, match="cannot run"):
        await load_hook("/nonexistent/hook", timeout=30)(BODY)


def test_hook_answers_and_plan_checks() -> None:
    assert context_info(BODY, " m1 ", "h")["id"] == "m1"
    for bad in ({"no": "id"}, "", 42):
        with pytest.raises(TargetProtocolError):
            context_info(BODY, bad, "h")
    with pytest.raises(InvalidPlan, match="cannot load"):
        load_hook("tests.auditor.nonexistent_module:f", timeout=1)
    with pytest.raises(InvalidPlan, match="--api openai"):
        AuditPlan.from_sources(None, {"target.context_hook": "x:y"})
    plan = AuditPlan.from_sources(None, {"target.api": "openai", "target.context_hook": "x:y"})
    assert plan.target.api == "openai"
    assert plan.public_dump()["target"]["context_hook"] == "x:y"
