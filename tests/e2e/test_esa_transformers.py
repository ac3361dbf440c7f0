"""End to end: ESA on a real `dpicl serve` process with the bundled SmolLM2 model and the
bundled MiniLM embedder, over HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import admin_headers, user_headers

pytestmark = pytest.mark.slow

DIALOGUES = [
    ("Ann: Lunch at noon? Ben: Yes, at the cafe.", "Ann and Ben will have lunch at noon."),
    ("Tom: I lost my keys. Sue: Check the car.", "Sue tells Tom to look in the car."),
    ("Kim: The report is late. Lee: I'll finish it.", "Lee will finish the late report."),
    ("Max: Movie tonight? Eva: Only a comedy.", "Eva will only watch a comedy."),
]


@pytest.mark.long
def test_esa_generate_with_real_model_and_embedder(start_server: Any, tmp_path: Any) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "transformers",
            "DPICL_WHITEBOX": "internal",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/esa.db",
        }
    )
    body = {
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
        "budget": None,
    }
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    query = "Joe: Can you feed the cat? Mia: Sure, after work."
    r = httpx.post(
        f"{srv.url}/v1/generate",
        json={"context_id": cid, "query": query},
        headers=user_headers(),
        timeout=300,
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text"].strip()
    assert out["engine"] == "transformers"
    assert out["cost"]["epsilon"] == 4.0
    r = httpx.post(
        f"{srv.url}/v1/debug/generate",
        json={"context_id": cid, "query": query},
        headers=admin_headers(),
        timeout=300,
    )
    assert r.status_code == 200, r.text
    dbg = r.json()
    assert dbg["text"] in dbg["candidates"]
    assert len(dbg["candidates"]) == 3
    assert len(dbg["partition_texts"]) == 2
    emb = np.asarray(dbg["partition_embeddings"])
    assert emb.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dbg["clean_mean"]), emb.mean(axis=0), atol=1e-9)
    info = httpx.get(f"{srv.url}/v1/contexts/{cid}", headers=admin_headers()).json()
    assert info["spent"]["queries"] == 2
