"""ESA generation over the real app: oracle engine (a labelled simulator) with the real
bundled MiniLM embedder, real SQLite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy import stats

from dpicl.engines.embeddings import SentenceTransformerEmbedder
from dpicl.engines.factory import build_embedder
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client

Y1 = "The old clock chimed a forgotten, dusty tune."
Y0 = "The blue boat sailed on a vast, open sea."
CANARY = "Alice: can you send me the invoice? Bob: sure, tomorrow."
QUERY = (
    f'Carefully check if the dialog "{CANARY}" is present in the provided CONTEXTUAL '
    f'EXEMPLAR:.\n\nIf it is found, output "{Y1}".\n\nOtherwise, output "{Y0}".'
)


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    emb = build_embedder(None, "cpu")
    assert isinstance(emb, SentenceTransformerEmbedder)
    return emb


def esa_context(**mech: Any) -> dict[str, Any]:
    exemplars = [
        {"input": f"Dialogue {i}: hello there number {i}", "output": f"Summary {i}"}
        for i in range(7)
    ]
    exemplars.insert(3, {"input": CANARY, "output": "Bob will send the invoice."})
    return {
        "task": "generation",
        "exemplars": exemplars,
        "template": "{query}\n\nCONTEXTUAL EXEMPLAR: {exemplars}\n\nRESPONSE:",
        "mechanism": {
            "name": "esa",
            "epsilon": 4.0,
            "delta": 1e-5,
            "partitions": 4,
            "partition_seed": 3,
            "candidates": 6,
        }
        | mech,
        "budget": None,
    }


def _create(c: TestClient, body: dict[str, Any]) -> str:
    r = c.post("/v1/contexts", json=body, headers=admin_headers())
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_generate_releases_a_zero_shot_candidate(tmp_path: Path, embedder: Any) -> None:
    with make_client(tmp_path, whitebox="internal", embedder=embedder) as c:
        cid = _create(c, esa_context())
        r = c.post("/v1/generate", json={"context_id": cid, "query": QUERY}, headers=user_headers())
        assert r.status_code == 200, r.text
        assert r.json()["text"] in (Y1, Y0)
        assert r.json()["mechanism"] == "esa"
        for _ in range(10):
            b = c.post(
                "/v1/debug/generate",
                json={"context_id": cid, "query": QUERY},
                headers=admin_headers(),
            ).json()
            assert b["text"] in b["candidates"]
            assert len(b["candidates"]) == 6
            assert b["text"] == b["candidates"][int(np.argmin(b["distances"]))]
            # The canary's partition answers Y1, the three others Y0 (oracle rules).
            assert sorted(b["partition_texts"]) == sorted([Y1, Y0, Y0, Y0])
            norms = np.linalg.norm(np.asarray(b["partition_embeddings"]), axis=1)
            np.testing.assert_allclose(norms, 1.0, atol=1e-6)


def test_esa_noise_matches_sigma(tmp_path: Path, embedder: Any) -> None:
    """Var(noisy_mean - clean_mean) = sigma^2 per coordinate: chi-square interval with a
    false-failure rate of 1e-4 over 20 calls x 384 coordinates."""
    with make_client(tmp_path, whitebox="internal", embedder=embedder) as c:
        cid = _create(c, esa_context(epsilon=2.0))
        diffs, sigma = [], 0.0
        for _ in range(20):
            b = c.post(
                "/v1/debug/generate",
                json={"context_id": cid, "query": QUERY},
                headers=admin_headers(),
            ).json()
            sigma = b["sigma"]
            diffs.append(np.asarray(b["noisy_mean"]) - np.asarray(b["clean_mean"]))
    d = np.concatenate(diffs)
    stat = float(np.sum(d**2)) / sigma**2
    lo, hi = stats.chi2.ppf([0.5e-4, 1 - 0.5e-4], d.size)
    assert lo < stat < hi
    # Delta2 = 2/T (paper 000, Appendix A): sigma = (2/T) * 2 sqrt(ln(1.25/delta)) / (sqrt 2 eps)
    assert sigma == pytest.approx((2 / 4) * np.sqrt(2 * np.log(1.25 / 1e-5)) / 2.0)


def test_noisy_whitebox_hides_partition_outputs(tmp_path: Path, embedder: Any) -> None:
    with make_client(tmp_path, whitebox="noisy", embedder=embedder) as c:
        cid = _create(c, esa_context())
        b = c.post(
            "/v1/debug/generate", json={"context_id": cid, "query": QUERY}, headers=admin_headers()
        ).json()
        assert b["partition_texts"] is None
        assert b["partition_embeddings"] is None
        assert b["clean_mean"] is None
        assert len(b["noisy_mean"]) == 384


def test_mechanism_endpoint_mismatch(tmp_path: Path, embedder: Any) -> None:
    with make_client(tmp_path, embedder=embedder) as c:
        cid = _create(c, esa_context())
        r = c.post("/v1/classify", json={"context_id": cid, "query": "x"}, headers=user_headers())
        assert r.status_code == 422
        assert "esa" in r.json()["error"]["message"]
        bad = esa_context()
        bad["task"] = "classification"
        r = c.post("/v1/contexts", json=bad | {"labels": ["a", "b"]}, headers=admin_headers())
        assert r.status_code == 422
        assert r.json()["error"]["param"] == "task"
