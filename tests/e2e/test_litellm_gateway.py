"""dpicl behind LiteLLM (the SDK and its Router), against a real `dpicl serve` process (oracle
engine): an exhausted budget (402 ``budget_exhausted``) reaches the caller after exactly one
request, with retries configured, and no fallback configured for other errors (context
window, content policy) answers it from another private context; the privacy cost arrives in
``usage.dpicl`` and in the ``llm_provider-x-dpicl-*`` headers LiteLLM keeps.

Every request is counted by the server itself (``dpicl_http_requests_total``), not by the
client that might retry. (The same Router retries a 429 three times and then falls back;
that was the budget's status before issue 39, README "Behind a gateway".)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import USER, admin_headers
from tests.server.api_helpers import voting_context
from tests.servers import ServerProcess, oracle_server_env

# Importing litellm takes 5 to 30 s: the module is slow, and imports it in a fixture so that
# collecting the suite does not pay for it.
pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Is 'Private record number 1' present?"}]


@pytest.fixture(scope="module")
def litellm() -> Any:
    # LiteLLM fetches a price list from the internet when imported unless told to use its own.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    module = pytest.importorskip("litellm", reason="litellm is in requirements-dev.txt")
    module.suppress_debug_info = True
    return module


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("litellm")
    env = oracle_server_env(tmp, whitebox="off") | {"DPICL_METRICS": "admin"}
    srv = ServerProcess(env, tmp / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def create(srv: ServerProcess, epsilon: float) -> str:
    """A voting context whose budget admits exactly one answer (one answer's exact epsilon
    is 0.751 and two compose to more than 0.9, test_openai_sdk.py)."""
    body = voting_context(budget={"epsilon": epsilon, "delta": 1e-5})
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def queries(srv: ServerProcess, cid: str) -> int:
    r = httpx.get(f"{srv.url}/v1/contexts/{cid}", headers=admin_headers(), timeout=30)
    return int(r.json()["spent"]["queries"])


def requests_seen(srv: ServerProcess) -> dict[str, float]:
    """The server's count of chat completions by status."""
    text = httpx.get(f"{srv.url}/metrics", headers=admin_headers(), timeout=30).text
    pattern = (
        r'dpicl_http_requests_total\{method="POST",route="/v1/chat/completions",'
        r'status="(\d+)"\} (\S+)'
    )
    return {status: float(n) for status, n in re.findall(pattern, text)}


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


def deployment(srv: ServerProcess, name: str, cid: str, key: str = USER) -> dict[str, Any]:
    params = {"model": f"openai/{cid}", "api_base": f"{srv.url}/v1", "api_key": key}
    return {"model_name": name, "litellm_params": params}


def test_sdk_one_call_one_request_and_the_cost_arrives(server: ServerProcess, litellm: Any) -> None:
    cid = create(server, epsilon=0.9)
    base = {"model": f"openai/{cid}", "api_base": f"{server.url}/v1", "api_key": USER}
    reply = litellm.completion(messages=MESSAGES, **base)
    assert reply.choices[0].message.content in ("Yes", "No")
    # The cost where LiteLLM keeps it: usage (its Usage keeps unknown fields) and the headers,
    # renamed llm_provider-x-dpicl-*.
    cost = reply.usage.dpicl
    assert cost["epsilon_spent"] > 0 and cost["queries_remaining"] == 0  # one answer fits
    headers = reply._hidden_params["additional_headers"]
    assert float(headers["llm_provider-x-dpicl-epsilon-spent"]) == cost["epsilon_spent"]
    assert float(headers["llm_provider-x-dpicl-epsilon-remaining"]) == pytest.approx(
        cost["epsilon_remaining"]
    )
    before = requests_seen(server)
    with pytest.raises(litellm.APIError) as err:
        litellm.completion(messages=MESSAGES, max_retries=3, **base)
    assert err.value.status_code == 402 and "budget" in str(err.value)
    assert delta(before, requests_seen(server)) == {"402": 1.0}
    assert queries(server, cid) == 1


def test_router_neither_retries_nor_falls_back(server: ServerProcess, litellm: Any) -> None:
    spent, other = create(server, epsilon=0.9), create(server, epsilon=100.0)
    litellm.completion(
        model=f"openai/{spent}", api_base=f"{server.url}/v1", api_key=USER, messages=MESSAGES
    )
    # Retries on, and fallbacks to the other context for the errors that may move a request
    # elsewhere (a prompt too long, a content policy): a spent budget is neither.
    router = litellm.Router(
        model_list=[deployment(server, "private-a", spent), deployment(server, "private-b", other)],
        num_retries=3,
        retry_after=0,
        context_window_fallbacks=[{"private-a": ["private-b"]}],
        content_policy_fallbacks=[{"private-a": ["private-b"]}],
    )
    before = requests_seen(server)
    with pytest.raises(litellm.APIError) as err:
        router.completion(model="private-a", messages=MESSAGES)
    assert err.value.status_code == 402
    assert delta(before, requests_seen(server)) == {"402": 1.0}
    assert (queries(server, spent), queries(server, other)) == (1, 0)
    # Streamed, the same: refused before the stream opens, once.
    before = requests_seen(server)
    with pytest.raises(litellm.APIError):
        for _ in router.completion(model="private-a", messages=MESSAGES, stream=True):
            pass
    assert delta(before, requests_seen(server)) == {"402": 1.0}
    assert (queries(server, spent), queries(server, other)) == (1, 0)


def test_fallbacks_are_the_routers_to_refuse(server: ServerProcess, litellm: Any) -> None:
    """What the README's gateway section warns about: LiteLLM's generic ``fallbacks`` move any
    failure, a 402 included, to the next group, so a dpicl group must have none; a request
    can also turn them off (``disable_fallbacks``)."""
    spent, other = create(server, epsilon=0.9), create(server, epsilon=100.0)
    litellm.completion(
        model=f"openai/{spent}", api_base=f"{server.url}/v1", api_key=USER, messages=MESSAGES
    )
    router = litellm.Router(
        model_list=[deployment(server, "private-a", spent), deployment(server, "private-b", other)],
        fallbacks=[{"private-a": ["private-b"]}],
    )
    with pytest.raises(litellm.APIError):
        router.completion(model="private-a", messages=MESSAGES, disable_fallbacks=True)
    assert queries(server, other) == 0
    reply = router.completion(model="private-a", messages=MESSAGES)
    # The other context answered and paid: the reason for "no fallbacks across contexts".
    assert reply.usage.dpicl["epsilon_spent"] > 0 and queries(server, other) == 1
