"""End to end: a real `dpicl serve` process with the transformers engine and the bundled
SmolLM2 model, classifying over HTTP as a new user would, and through the official `openai`
SDK (one classification, one short streamed DPS-MOZO generation; one server for both, since
loading the model is most of the time)."""

from __future__ import annotations

import os
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import USER, admin_headers, user_headers

pytestmark = pytest.mark.slow

REVIEWS = [
    ("I loved this film, it was wonderful and moving.", "positive"),
    ("Terrible service, cold food and a rude waiter.", "negative"),
    ("An absolute delight from start to finish.", "positive"),
    ("The product broke after one day. Awful.", "negative"),
    ("Great value, works perfectly, very happy.", "positive"),
    ("Boring, slow and far too long.", "negative"),
    ("Fantastic staff and a beautiful room.", "positive"),
    ("I want my money back, this is junk.", "negative"),
]
#: A voting context of the reviews (T = 4, epsilon 4 an answer, a budget of ten answers).
REVIEWS_CONTEXT = {
    "task": "classification",
    "labels": ["positive", "negative"],
    "exemplars": [{"input": i, "output": o} for i, o in REVIEWS],
    "mechanism": {"name": "voting", "epsilon": 4.0, "delta": 1e-5, "partitions": 4},
    "budget": {"epsilon": 40.0, "delta": 1e-4},
}


def test_classify_with_real_model_over_http(start_server: Any, tmp_path: Any) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "transformers",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/e2e.db",
            "DPICL_TORCH_THREADS": "2",
        }
    )
    ready = httpx.get(f"{srv.url}/readyz").json()
    # The setting reaches torch, and the inter-op pool defaults to half of it.
    assert (ready["torch_threads"], ready["torch_interop_threads"]) == (2, 1)
    # `dpicl serve` set OpenMP's passive wait before torch loaded (unless the caller set it).
    assert ready["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    # The model runs in an engine process of its own (DPICL_ENGINE_PROCESS=auto), in float32
    # on the CPU (DPICL_DTYPE=auto), from the bundled weights.
    assert ready["engine_pid"] not in (None, ready["pid"])
    assert (ready["device"], ready["dtype"], ready["load_format"]) == ("cpu", "float32", "auto")
    # DPICL_DEVICE=auto (the default) chose the CPU: torch sees no GPU here.
    assert ready["device_setting"] == os.environ.get("DPICL_DEVICE", "auto")
    health = httpx.get(f"{srv.url}/healthz").json()
    assert health["engine"] == "transformers" and health["simulator"] is False
    assert "SmolLM2" in health["model"] or "smollm2" in health["model"].lower()
    body = REVIEWS_CONTEXT
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    # The context as an OpenAI model names the engine and the weights' dtype.
    model = httpx.get(f"{srv.url}/v1/models/{cid}", headers=user_headers()).json()["dpicl"]
    assert (model["engine"], model["dtype"], model["load_format"]) == (
        "transformers",
        "float32",
        "auto",
    )
    for query in ("What a lovely, happy day, I enjoyed every minute.", "Awful and broken."):
        r = httpx.post(
            f"{srv.url}/v1/classify",
            json={"context_id": cid, "query": query},
            headers=user_headers(),
            timeout=120,
        )
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["label"] in ("positive", "negative")
        assert out["engine"] == "transformers"
        assert out["cost"]["epsilon"] == 4.0
        assert out["budget"]["remaining_epsilon"] < 40.0
    info = httpx.get(f"{srv.url}/v1/contexts/{cid}", headers=admin_headers()).json()
    assert info["spent"]["queries"] == 2

    # The same server through the OpenAI SDK: a context is a model.
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=USER, max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=cid, messages=[{"role": "user", "content": "What a lovely, happy day."}]
    )
    assert reply.choices[0].message.content in ("positive", "negative")
    ext = reply.model_extra["dpicl"]  # type: ignore[index]
    assert ext["engine"] == "transformers" and ext["cost"]["epsilon"] == 4.0
    assert ext["budget"]["queries"] == 3
    mech = {"name": "dps-mozo", "epsilon": 4.0, "n_shots": 1, "top_k": 20}
    body = {
        "task": "generation",
        "exemplars": [{"input": i, "output": o} for i, o in REVIEWS[:2]],
        "mechanism": mech | {"max_tokens": 2, "queries": 2},
    }
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    chunks = list(
        client.completions.create(model=r.json()["id"], prompt="A fine film.", stream=True)
    )
    final = chunks[-1]
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.model_extra["dpicl"]["budget"]["queries"] == 1  # type: ignore[index]
    assert len(chunks) <= 2 + 2  # the opening chunk, at most 2 tokens, the closing chunk
    text = "".join(c.choices[0].text for c in chunks)
    assert text or final.choices[0].finish_reason == "stop"
