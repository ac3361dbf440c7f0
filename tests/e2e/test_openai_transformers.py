"""The official `openai` SDK against `dpicl serve` on the bundled SmolLM2 model (CPU): one
private-voting classification and one short streamed DPS-MOZO generation, each charged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import USER, admin_headers

pytestmark = pytest.mark.slow

REVIEWS = [
    ("I loved this film, it was wonderful.", "positive"),
    ("Terrible service and cold food.", "negative"),
    ("An absolute delight from start to finish.", "positive"),
    ("The product broke after one day.", "negative"),
]


def test_sdk_classifies_and_streams_with_the_real_model(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(
        {"DPICL_ENGINE": "transformers", "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/m.db"}
    )

    def create(body: dict[str, Any]) -> str:
        r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=60)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    examples = [{"input": i, "output": o} for i, o in REVIEWS]
    vote = create(
        {
            "task": "classification",
            "labels": ["positive", "negative"],
            "exemplars": examples,
            "mechanism": {"name": "voting", "epsilon": 4.0, "delta": 1e-5, "partitions": 2},
            "budget": {"epsilon": 40.0, "delta": 1e-4},
        }
    )
    mech = {"name": "dps-mozo", "epsilon": 4.0, "n_shots": 2, "top_k": 20}
    mozo = create(
        {
            "task": "generation",
            "exemplars": examples,
            "mechanism": mech | {"max_tokens": 3, "queries": 2},
        }
    )
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=USER, max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=vote, messages=[{"role": "user", "content": "What a lovely, happy day."}]
    )
    assert reply.choices[0].message.content in ("positive", "negative")
    ext = reply.model_extra["dpicl"]  # type: ignore[index]
    assert ext["engine"] == "transformers" and ext["cost"]["epsilon"] == 4.0
    chunks = list(client.completions.create(model=mozo, prompt="Review: a fine film.", stream=True))
    final = chunks[-1]
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.model_extra["dpicl"]["budget"]["queries"] == 1  # type: ignore[index]
    text = "".join(c.choices[0].text for c in chunks)
    assert len(chunks) <= 3 + 2  # the opening chunk, at most 3 tokens, the closing chunk
    assert text or final.choices[0].finish_reason == "stop"
