"""End to end: a real `dpicl serve` process with the transformers engine and the bundled
SmolLM2 model, generating with DPS-MOZO over HTTP (white-box on, to see the per-token bounds)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import admin_headers, user_headers

pytestmark = pytest.mark.slow

DIALOGUES = [
    ("Ann: Lunch at noon? Ben: Sure, see you at the cafe.", "Ann and Ben meet for lunch."),
    ("Tom: Did you send the report? Eva: Yes, this morning.", "Eva sent the report."),
    ("Max: The train is late. Joe: I'll pick you up.", "Joe will pick Max up."),
    ("Sue: Can I borrow your bike? Kim: Of course.", "Kim lends Sue her bike."),
]


@pytest.mark.long
def test_mozo_generation_with_real_model_over_http(start_server: Any, tmp_path: Any) -> None:
    srv = start_server(
        {
            "DPICL_ENGINE": "transformers",
            "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/e2e.db",
            "DPICL_WHITEBOX": "noisy",
        }
    )
    body = {
        "task": "generation",
        "exemplars": [{"input": i, "output": o} for i, o in DIALOGUES],
        "mechanism": {
            "name": "dps-mozo",
            "epsilon": 4.0,
            "n_shots": 2,
            "top_k": 20,
            "max_tokens": 8,
            "queries": 2,
        },
    }
    r = httpx.post(f"{srv.url}/v1/contexts", json=body, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    query = {"context_id": cid, "query": "Liz: Are we still on for tennis? Pat: Yes, at five."}
    r = httpx.post(f"{srv.url}/v1/generate", json=query, headers=user_headers(), timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["engine"] == "transformers" and out["mechanism"] == "dps-mozo"
    assert isinstance(out["text"], str)
    assert out["budget"]["remaining_queries"] == 1
    r = httpx.post(f"{srv.url}/v1/debug/generate", json=query, headers=admin_headers(), timeout=300)
    assert r.status_code == 200, r.text
    dbg = r.json()
    assert 1 <= len(dbg["tokens"]) <= 8
    for tok in dbg["tokens"]:
        assert len(tok["top_ids"]) == 20 and tok["token_id"] in tok["top_ids"]
        assert all(0.0 <= lam <= 1.5 for lam in tok["lambdas"])
        # The proven default: every shot's mixed distribution within max_log_ratio.
        assert dbg["guarantee"] == "proven" and dbg["radius"] == dbg["max_log_ratio"]
        assert max(tok["log_ratios"]) <= dbg["max_log_ratio"]
    r = httpx.post(f"{srv.url}/v1/generate", json=query, headers=user_headers(), timeout=60)
    assert r.status_code == 402 and r.json()["error"]["code"] == "budget_exhausted"
