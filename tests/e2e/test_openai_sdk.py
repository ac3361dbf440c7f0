"""The official `openai` SDK against a real `dpicl serve` process (oracle engine): a context
is a model; classification, ESA and DPS-MOZO answer through chat and text completions,
streaming included; every refused parameter, an exhausted budget and an unknown model answer
OpenAI-shaped errors; the charge is the native routes' charge."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ADMIN, USER, admin_headers, user_headers
from tests.server.api_helpers import voting_context
from tests.servers import ServerProcess, oracle_server_env

CANARY_QUERY = "Is 'Private record number 1: customer paid invoice 1001' present?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("openai")
    srv = ServerProcess(oracle_server_env(tmp, whitebox="off"), tmp / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def sdk(srv: ServerProcess, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=USER, max_retries=0, **kw)


def create(srv: ServerProcess, body: dict[str, Any]) -> str:
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def ledger(srv: ServerProcess, cid: str) -> dict[str, Any]:
    r = httpx.get(f"{srv.url}/v1/contexts/{cid}", headers=admin_headers(), timeout=30)
    out: dict[str, Any] = r.json()["spent"]
    return out


def mozo_body(max_tokens: int = 8, queries: int = 4) -> dict[str, Any]:
    exemplars = [
        {"input": f"Dialogue {i}: we met about topic {i}", "output": f"They discussed topic {i}."}
        for i in range(8)
    ]
    mech = {"name": "dps-mozo", "epsilon": 4.0, "n_shots": 2, "top_k": 20}
    mech |= {"max_tokens": max_tokens, "queries": queries}
    return {"task": "generation", "exemplars": exemplars, "mechanism": mech}


def esa_body() -> dict[str, Any]:
    exemplars = [
        {"input": f"Dialogue {i}: hello number {i}", "output": f"Summary {i}"} for i in range(8)
    ]
    mech = {"name": "esa", "epsilon": 4.0, "delta": 1e-5, "partitions": 4, "candidates": 4}
    return {
        "task": "generation",
        "exemplars": exemplars,
        "mechanism": mech,
        "budget": {"epsilon": 100.0, "delta": 1e-4},
    }


def budgeted_voting(epsilon: float = 8.0) -> dict[str, Any]:
    return voting_context(budget={"epsilon": epsilon, "delta": 1e-5})


def test_models_list_and_retrieve(server: ServerProcess) -> None:
    vote = create(server, budgeted_voting())
    mozo = create(server, mozo_body())
    client = sdk(server)
    models = {m.id: m for m in client.models.list()}
    assert {vote, mozo} <= set(models)
    ext = models[vote].model_extra["dpicl"]  # type: ignore[index]
    assert ext["task"] == "classification" and ext["mechanism"] == "voting"
    assert ext["epsilon"] == 1.0 and ext["delta"] == 1e-5 and ext["labels"] == ["Yes", "No"]
    assert ext["spent"]["remaining_epsilon"] == 8.0
    assert models[mozo].model_extra["dpicl"]["mechanism"] == "dps-mozo"  # type: ignore[index]
    one = client.models.retrieve(vote)
    assert one.id == vote and one.object == "model" and one.owned_by == "dpicl"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("ctx_000000000000000000000000")
    assert err.value.code == "model_not_found" and err.value.param == "model"


def test_classify_is_charged_as_the_native_route(server: ServerProcess) -> None:
    """The README's four lines: the label, its cost in the body and in the headers; the same
    ledger charge as /v1/classify on an identical context."""
    chat_ctx, native_ctx = create(server, budgeted_voting()), create(server, budgeted_voting())
    client = sdk(server)
    raw = client.chat.completions.with_raw_response.create(
        model=chat_ctx, messages=[{"role": "user", "content": CANARY_QUERY}]
    )
    out = raw.parse()
    assert out.object == "chat.completion" and out.model == chat_ctx
    assert out.choices[0].message.content in ("Yes", "No")
    assert out.choices[0].finish_reason == "stop"
    ext = out.model_extra["dpicl"]  # type: ignore[index]
    assert ext["label"] == out.choices[0].message.content and ext["engine"] == "oracle"
    assert ext["cost"]["epsilon"] == 1.0
    assert float(raw.headers["X-DPICL-Epsilon-Spent"]) == 1.0
    assert float(raw.headers["X-DPICL-Delta-Spent"]) == 1e-5
    remaining = float(raw.headers["X-DPICL-Epsilon-Remaining"])
    assert remaining == pytest.approx(ext["budget"]["remaining_epsilon"], rel=1e-12)
    r = httpx.post(
        f"{server.url}/v1/classify",
        json={"context_id": native_ctx, "query": CANARY_QUERY},
        headers=user_headers(),
    )
    assert r.status_code == 200
    native, chat = ledger(server, native_ctx), ledger(server, chat_ctx)
    assert chat == native and chat["queries"] == 1
    assert remaining == pytest.approx(native["remaining_epsilon"], rel=1e-12)
    # The text-completion route answers the same way.
    text = client.completions.create(model=chat_ctx, prompt=CANARY_QUERY)
    assert text.object == "text_completion" and text.choices[0].text in ("Yes", "No")
    assert ledger(server, chat_ctx)["queries"] == 2


def test_esa_completion(server: ServerProcess) -> None:
    cid = create(server, esa_body())
    client = sdk(server, timeout=120)
    out = client.completions.create(model=cid, prompt="Dialogue 3: hello number 3", max_tokens=8)
    ext = out.model_extra["dpicl"]  # type: ignore[index]
    assert ext["mechanism"] == "esa" and ext["label"] is None
    assert out.choices[0].text.strip() != ""
    assert ledger(server, cid)["queries"] == 1
    # Streamed: the one released answer as a single chunk (then [DONE]).
    chunks = list(
        client.chat.completions.create(
            model=cid, messages=[{"role": "user", "content": "Dialogue 2"}], stream=True
        )
    )
    assert len(chunks) == 1 and chunks[0].choices[0].finish_reason == "stop"
    assert chunks[0].choices[0].delta.content
    assert chunks[0].model_extra["dpicl"]["mechanism"] == "esa"  # type: ignore[index]
    assert ledger(server, cid)["queries"] == 2


def test_mozo_completion_and_stream(server: ServerProcess) -> None:
    cid = create(server, mozo_body(max_tokens=8, queries=3))
    client = sdk(server)
    out = client.chat.completions.create(
        model=cid, messages=[{"role": "user", "content": "Summarise topic 3."}]
    )
    ext = out.model_extra["dpicl"]  # type: ignore[index]
    assert ext["mechanism"] == "dps-mozo" and ext["cost"]["epsilon_total"] == 4.0
    assert out.usage is not None and out.usage.completion_tokens <= 8
    assert out.choices[0].finish_reason in ("stop", "length")
    with client.chat.completions.with_streaming_response.create(
        model=cid,
        messages=[{"role": "user", "content": "Summarise topic 5."}],
        stream=True,
        stream_options={"include_usage": True},
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert float(resp.headers["X-DPICL-Epsilon-Spent"]) == ext["cost"]["epsilon"]
        chunks = list(resp.parse())
    first, *middle, last_choice, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    final = last_choice.choices[0]
    assert final.finish_reason in ("stop", "length")
    assert last_choice.model_extra["dpicl"]["budget"]["queries"] == 2  # type: ignore[index]
    assert usage.choices == [] and usage.usage is not None
    # One chunk per piece of text as its token was sampled (the oracle's tokens are single
    # characters or pseudo-words, each a visible piece).
    assert len(middle) == usage.usage.completion_tokens
    text = "".join(c.choices[0].delta.content or "" for c in middle)
    assert len(text) > 0 or usage.usage.completion_tokens == 0
    # Text completions stream the same way.
    pieces = list(client.completions.create(model=cid, prompt="Summarise topic 1.", stream=True))
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")
    assert ledger(server, cid)["queries"] == 3
    # The context's 3 queries are spent: a fourth is refused, streamed or not, uncharged.
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as err:
            client.completions.create(model=cid, prompt="again", stream=stream)
        assert (err.value.status_code, err.value.code) == (402, "budget_exhausted")
    assert ledger(server, cid)["queries"] == 3


REFUSED_CHAT: list[tuple[str, dict[str, Any]]] = [
    ("logprobs", {"logprobs": True}),
    ("top_logprobs", {"top_logprobs": 3}),
    ("n", {"n": 2}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("tool_choice", {"tool_choice": "auto"}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("seed", {"seed": 7}),
    ("stop", {"stop": ["."]}),
    ("logit_bias", {"logit_bias": {"42": 10}}),
    ("functions", {"functions": [{"name": "f", "parameters": {}}]}),
    ("modalities", {"modalities": ["text", "audio"]}),
    ("prediction", {"prediction": {"type": "content", "content": "x"}}),
]
REFUSED_TEXT: list[tuple[str, dict[str, Any]]] = [
    ("echo", {"echo": True}),
    ("logprobs", {"logprobs": 2}),
    ("best_of", {"best_of": 2}),
    ("n", {"n": 3}),
    ("suffix", {"suffix": "end"}),
    ("seed", {"seed": 1}),
]


def test_every_refused_parameter_is_named_and_uncharged(server: ServerProcess) -> None:
    cid = create(server, budgeted_voting())
    client = sdk(server)
    for name, extra in REFUSED_CHAT:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=cid, messages=[{"role": "user", "content": CANARY_QUERY}], **extra
            )
        assert (err.value.param, err.value.code) == (name, "unsupported_parameter"), name
        assert name in err.value.message
    for name, extra in REFUSED_TEXT:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=cid, prompt=CANARY_QUERY, **extra)
        assert (err.value.param, err.value.code) == (name, "unsupported_parameter"), name
    # Neutral values of the same parameters, and the listed harmless ones, are accepted.
    out = client.chat.completions.create(
        model=cid,
        messages=[{"role": "system", "content": "ignored"}, {"role": "user", "content": "q?"}],
        logprobs=False,
        n=1,
        tools=[],
        tool_choice="none",
        temperature=0.7,
        top_p=0.9,
        user="someone",
    )
    assert out.choices[0].message.content in ("Yes", "No")
    # Bad values and shapes: 400s naming them, never a 500.
    bad: list[tuple[str, dict[str, Any]]] = [
        ("messages", {"messages": [{"role": "assistant", "content": "hi"}]}),
        ("messages.0.content", {"messages": [{"role": "user", "content": "   "}]}),
        (
            "messages.0.content.0.type",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
        ),
        ("temperature", {"messages": [{"role": "user", "content": "q"}], "temperature": 9}),
        ("max_tokens", {"messages": [{"role": "user", "content": "q"}], "max_tokens": 0}),
    ]
    for param, body in bad:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=cid, **body)
        assert err.value.param == param, (param, err.value.message)
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": cid, "messages": [{"role": "user", "content": "q"}], "foo": 1},
        headers=user_headers(),
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "foo"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=cid, prompt=[1, 2, 3])
    assert err.value.param == "prompt"
    assert ledger(server, cid)["queries"] == 1  # only the accepted request was charged


def test_exhausted_budget_and_unknown_model(server: ServerProcess) -> None:
    # One answer's exact epsilon is 0.751; two compose to more than 0.9: one answer fits.
    cid = create(server, budgeted_voting(epsilon=0.9))
    # The SDK retries a 429 by default, not a 402; x-should-retry: false says so besides.
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=USER, max_retries=2)
    client.chat.completions.create(model=cid, messages=[{"role": "user", "content": "q"}])
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=cid, messages=[{"role": "user", "content": "q"}])
    assert time.monotonic() - t0 < 0.4  # not retried (the SDK's first backoff is >= 0.4 s)
    e = err.value
    assert e.status_code == 402 and e.code == "budget_exhausted"
    assert e.type == "insufficient_quota"
    assert "retry-after" not in e.response.headers
    assert e.response.headers["x-should-retry"] == "false"
    assert set(e.response.json()["error"]) == {"message", "type", "param", "code"}
    assert ledger(server, cid)["queries"] == 1
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(
            model="ctx_ffffffffffffffffffffffff", messages=[{"role": "user", "content": "q"}]
        )
    assert nf.value.code == "model_not_found" and nf.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="q")
    with pytest.raises(openai.AuthenticationError) as auth:
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert "not valid" in auth.value.message and "required" not in auth.value.message
    # Routes dpicl does not serve answer in OpenAI's shape too, so the SDK says why.
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model=cid, input="q")
    assert "/v1/embeddings" in missing.value.message and missing.value.code == "not_found"
    r = httpx.post(f"{server.url}/v1/responses", json={"model": cid, "input": "q"})
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    # The native routes keep their own shape; an exhausted budget is the same 402 there.
    r = httpx.post(
        f"{server.url}/v1/classify", json={"context_id": cid, "query": "q"}, headers=user_headers()
    )
    assert r.status_code == 402 and r.headers["x-should-retry"] == "false"
    assert "retry-after" not in r.headers
    assert r.json() == {
        "error": {
            "code": "budget_exhausted",
            "message": r.json()["error"]["message"],
            "param": "context_id",
        }
    }


def test_docs_load_offline(server: ServerProcess) -> None:
    """/docs and /redoc reference only this server's assets, and the server serves them."""
    import re

    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{server.url}{page}").text
        urls = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert urls, page
        for url in urls:
            assert url.startswith("/") and not url.startswith("//"), (page, url)
            r = httpx.get(f"{server.url}{url}")
            assert r.status_code == 200 and len(r.content) > 1000, url
        assert "http://" not in html and "https://" not in html, page
    assert httpx.get(f"{server.url}/docs/assets/..%2Fcore.py").status_code == 404
    spec = httpx.get(f"{server.url}/openapi.json").json()
    assert {"/v1/models", "/v1/chat/completions", "/v1/completions"} <= set(spec["paths"])


def test_docs_can_be_turned_off(tmp_path: Path) -> None:
    from tests.server.api_helpers import make_client

    with make_client(tmp_path, docs=False) as c:
        assert c.get("/docs").status_code == 404 and c.get("/redoc").status_code == 404
        assert c.get("/openapi.json").status_code == 200


def test_disconnect_mid_stream_stops_sampling_and_keeps_the_charge(
    start_server: Any, tmp_path: Path
) -> None:
    """A DPS-MOZO stream whose client leaves after two tokens: sampling stops within a step
    or two, and the answer stays charged (it was charged whole before its first token)."""
    steps = tmp_path / "steps.log"
    env = oracle_server_env(tmp_path, whitebox="off") | {"DPICL_TEST_STEP_LOG": str(steps)}
    srv = start_server(env, fault="tests.e2e.slow_decoding_server")
    cid = create(srv, mozo_body(max_tokens=60, queries=2))
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=USER, max_retries=0)
    stream = client.chat.completions.create(
        model=cid, messages=[{"role": "user", "content": "Summarise topic 2."}], stream=True
    )
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
        if seen == 2:
            break
    stream.close()  # the connection goes
    at_close = len(steps.read_text().splitlines())
    time.sleep(1.0)  # ten steps' time
    after = len(steps.read_text().splitlines())
    assert after <= at_close + 2, (at_close, after)
    assert after < 20  # far from the 60 tokens it would have sampled
    spent = ledger(srv, cid)
    assert spent["queries"] == 1 and spent["remaining_queries"] == 1
    # The server still answers, and the next query is charged as usual.
    r = httpx.post(
        f"{srv.url}/v1/generate",
        json={"context_id": cid, "query": "hi", "max_tokens": 2},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    assert r.status_code == 200 and ledger(srv, cid)["queries"] == 2


def test_readme_snippet_runs_against_dpicl_serve(
    start_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's four lines, as a new user runs them: a fresh server, the README's own
    classification context, the snippet executed as written (only its URL and key swapped)."""
    import re

    from tests.servers import ROOT

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- openai-snippet.*?```python\n(.*?)```", readme, re.S)
    assert block is not None, "the README lost its openai snippet"
    code = block.group(1)
    assert 'base_url="http://127.0.0.1:8000/v1"' in code and 'api_key="user-key"' in code
    srv = start_server(oracle_server_env(tmp_path, whitebox="off"))
    create(
        srv,
        {
            "task": "classification",
            "labels": ["positive", "negative"],
            "exemplars": [
                {"input": "Loved it", "output": "positive"},
                {"input": "Awful", "output": "negative"},
            ],
            "mechanism": {"name": "voting", "epsilon": 1.0, "delta": 1e-5, "partitions": 2},
            "budget": {"epsilon": 4.0, "delta": 1e-5},
        },
    )
    code = code.replace("http://127.0.0.1:8000/v1", f"{srv.url}/v1").replace("user-key", USER)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.split()[0] in ("positive", "negative")
    assert "'epsilon': 1.0" in printed and "'remaining_epsilon'" in printed


def _dom(url: str) -> str:
    """The page as headless Chromium (Debian's ``chromium``, installed by ``.ci/run`` where
    apt-get can) renders it, with every host but 127.0.0.1 unresolvable."""
    import shutil
    import subprocess

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's package)")
    out = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


@pytest.mark.slow
def test_docs_render_in_a_browser_without_internet(server: ServerProcess) -> None:
    """A page that still needed a CDN would render no operation here: FastAPI's default
    /docs, which loads Swagger UI from cdn.jsdelivr.net, renders none under the same rules
    (checked by hand on 2026-11-25)."""
    import re

    swagger = _dom(f"{server.url}/docs")
    paths = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', swagger))
    assert {"/v1/classify", "/v1/models", "/v1/chat/completions", "/v1/completions"} <= paths
    redoc = _dom(f"{server.url}/redoc")
    assert "/v1/chat/completions" in redoc and "Something went wrong" not in redoc
