"""End to end: a real `dpicl serve` process with DPICL_ENGINE=vllm (the CPU build) on the
bundled SmolLM2, used over HTTP as a new user would: one voting classification, one ESA
generation and one DPS-MOZO generation, on one server."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import admin_headers, user_headers
from tests.vllm.conftest import CPU_ENV, KV_CACHE_GIB, MAX_MODEL_LEN, needs_vllm

pytestmark = [needs_vllm, pytest.mark.slow]

REVIEWS = [
    ("I loved this film, it was wonderful and moving.", "positive"),
    ("Terrible service, cold food and a rude waiter.", "negative"),
    ("An absolute delight from start to finish.", "positive"),
    ("The product broke after one day. Awful.", "negative"),
]
DIALOGUES = [
    ("Ann: Lunch at noon? Ben: Sure, see you at the cafe.", "Ann and Ben meet for lunch."),
    ("Tom: Did you send the report? Eva: Yes, this morning.", "Eva sent the report."),
    ("Max: The train is late. Joe: I'll pick you up.", "Joe will pick Max up."),
    ("Sue: Can I borrow your bike? Kim: Of course.", "Kim lends Sue her bike."),
]


def _create(url: str, body: dict[str, Any]) -> str:
    r = httpx.post(f"{url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _ask(url: str, route: str, cid: str, query: str) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/v1/{route}",
        json={"context_id": cid, "query": query},
        headers=user_headers(),
        timeout=300,
    )
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    assert out["engine"] == "vllm"
    return out


def test_vllm_server_classifies_and_generates(start_server: Any, tmp_path: Any) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "vllm",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/vllm.db",
            "DPICL_VLLM_ENFORCE_EAGER": "true",
            "DPICL_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
            "DPICL_VLLM_KV_CACHE_GIB": str(KV_CACHE_GIB),
            **CPU_ENV,
        },
        wait=False,
    )
    srv.wait_ready(timeout=600)
    health = httpx.get(f"{srv.url}/healthz").json()
    assert health["engine"] == "vllm" and health["simulator"] is False
    assert "smollm2" in health["model"].lower()

    voting = _create(
        srv.url,
        {
            "task": "classification",
            "labels": ["positive", "negative"],
            "exemplars": [{"input": i, "output": o} for i, o in REVIEWS],
            "mechanism": {"name": "voting", "epsilon": 4.0, "delta": 1e-5, "partitions": 2},
            "budget": {"epsilon": 40.0, "delta": 1e-4},
        },
    )
    out = _ask(srv.url, "classify", voting, "What a lovely, happy day, I enjoyed it.")
    assert out["label"] in ("positive", "negative")
    assert out["cost"]["epsilon"] == 4.0

    esa = _create(
        srv.url,
        {
            "task": "generation",
            "exemplars": [{"input": i, "output": o} for i, o in DIALOGUES],
            "mechanism": {
                "name": "esa",
                "epsilon": 4.0,
                "delta": 1e-5,
                "partitions": 2,
                "candidates": 3,
                "max_tokens": 12,
            },
            "budget": {"epsilon": 40.0, "delta": 1e-4},
        },
    )
    out = _ask(srv.url, "generate", esa, "Joe: Can you feed the cat? Mia: Sure, after work.")
    assert out["text"].strip() and out["mechanism"] == "esa"

    mozo = _create(
        srv.url,
        {
            "task": "generation",
            "exemplars": [{"input": i, "output": o} for i, o in DIALOGUES],
            "mechanism": {
                "name": "dps-mozo",
                "epsilon": 4.0,
                "n_shots": 2,
                "top_k": 20,
                "max_tokens": 6,
                "queries": 2,
            },
        },
    )
    out = _ask(srv.url, "generate", mozo, "Liz: Tennis at five? Pat: Yes.")
    assert isinstance(out["text"], str) and out["mechanism"] == "dps-mozo"
    assert out["budget"]["remaining_queries"] == 1
