"""End to end: a real `dpicl serve` process with the transformers engine and the bundled
SmolLM2 model, classifying over HTTP as a new user would."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from tests.conftest import admin_headers, user_headers

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
    health = httpx.get(f"{srv.url}/healthz").json()
    assert health["engine"] == "transformers" and health["simulator"] is False
    assert "SmolLM2" in health["model"] or "smollm2" in health["model"].lower()
    body = {
        "task": "classification",
        "labels": ["positive", "negative"],
        "exemplars": [{"input": i, "output": o} for i, o in REVIEWS],
        "mechanism": {"name": "voting", "epsilon": 4.0, "delta": 1e-5, "partitions": 4},
        "budget": {"epsilon": 40.0, "delta": 1e-4},
    }
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
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
