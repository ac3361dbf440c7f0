"""DPS-MOZO over the real app: oracle engine (a labelled simulator), real SQLite ledger.

Covers the query budget (exactly `queries` answers, then 402 budget_exhausted), the debug
fields at noisy and internal, the per-token bounds, the offline mode and bad settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from dpicl.mechanisms.dps_mozo.calibration import calibrate_beta
from dpicl.mechanisms.dps_mozo.proven import calibrate_max_log_ratio, proven_epsilon
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client

QUERY = "Summarise the meeting about the quarterly invoices."


def mozo_context(**mech: Any) -> dict[str, Any]:
    exemplars = [
        {"input": f"Dialogue {i}: we met about topic {i}", "output": f"They discussed topic {i}."}
        for i in range(8)
    ]
    settings = {
        "name": "dps-mozo",
        "epsilon": 4.0,
        "n_shots": 2,
        "top_k": 20,
        "max_tokens": 6,
        "queries": 3,
    }
    settings.update(mech)
    return {"task": "generation", "exemplars": exemplars, "mechanism": settings}


def create(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/contexts", json=body, headers=admin_headers())
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def generate(client: TestClient, cid: str, path: str = "/v1/generate") -> Any:
    headers = admin_headers() if "debug" in path else user_headers()
    return client.post(path, json={"context_id": cid, "query": QUERY}, headers=headers)


def test_context_answers_exactly_its_queries(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        info = create(client, mozo_context(guarantee="paper"))
        m = info["mechanism"]
        assert m["guarantee"] == "paper" and m["max_log_ratio"] is None
        cal = calibrate_beta(4.0, 1 / 8, None, tokens=3 * 6, sample_rate=2 / 8)
        assert m["beta"] == pytest.approx(cal.beta) and m["alpha"] == cal.alpha
        assert m["delta"] == pytest.approx(1 / 8)
        assert info["budget"] == {"epsilon": 4.0, "delta": 0.125}
        assert info["spent"]["remaining_queries"] == 3
        spent = []
        for k in range(3):
            r = generate(client, info["id"])
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["mechanism"] == "dps-mozo" and out["engine"] == "oracle"
            assert 0 < out["cost"]["epsilon"] < 4.0
            assert out["cost"]["epsilon_total"] == 4.0
            assert out["budget"]["queries"] == k + 1
            assert out["budget"]["remaining_queries"] == 2 - k
            spent.append(out["budget"]["spent_epsilon"])
        assert spent == sorted(spent) and spent[-1] <= 4.0 + 1e-6
        r = generate(client, info["id"])
        assert r.status_code == 402
        assert r.json()["error"]["code"] == "budget_exhausted"
        after = client.get(f"/v1/contexts/{info['id']}", headers=admin_headers()).json()
        assert after["spent"]["queries"] == 3


def test_proven_is_the_default_and_its_epsilon_is_exact(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        info = create(client, mozo_context())
        m = info["mechanism"]
        cal = calibrate_max_log_ratio(4.0, 1 / 8, n_shots=2, sample_rate=2 / 8, tokens=3 * 6)
        assert m["guarantee"] == "proven"
        assert m["max_log_ratio"] == pytest.approx(cal.max_log_ratio)
        assert m["per_token_epsilon"] == pytest.approx(4 * cal.max_log_ratio)
        assert "beta" not in m and "alpha" in m and m["alpha"] is None
        spent = []
        for k in range(3):
            out = generate(client, info["id"]).json()
            # One answer of T_max tokens is worth the exact composition of 6 tokens.
            one = proven_epsilon(cal.max_log_ratio, 2, 2 / 8, 6, 1 / 8)
            assert out["cost"]["epsilon"] == pytest.approx(one)
            assert out["cost"]["epsilon_exact"] == pytest.approx(one)
            spent.append(out["budget"]["spent_epsilon"])
            assert spent[-1] == pytest.approx(
                proven_epsilon(cal.max_log_ratio, 2, 2 / 8, 6 * (k + 1), 1 / 8)
            )
        assert spent[-1] <= 4.0
        assert generate(client, info["id"]).status_code == 402


def test_proven_rejects_alpha(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        r = client.post("/v1/contexts", json=mozo_context(alpha=4), headers=admin_headers())
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "mechanism.alpha"
        assert "alpha=4" in r.json()["error"]["message"]


def test_debug_internal_proven_checks_token_by_token(tmp_path: Path) -> None:
    with make_client(tmp_path, whitebox="internal") as client:
        info = create(client, mozo_context(n_shots=3))
        out = generate(client, info["id"], "/v1/debug/generate").json()
        eps0 = out["max_log_ratio"]
        assert out["guarantee"] == "proven" and eps0 == info["mechanism"]["max_log_ratio"]
        assert out["per_token_epsilon"] == pytest.approx(4 * eps0)
        assert out["per_token_bound"] == out["per_token_epsilon"]
        assert out["alpha"] is None and out["beta"] is None
        assert out["max_exact_divergence"] is None
        assert out["tokens"]
        for tok in out["tokens"]:
            zero = np.log(np.array(tok["zero_shot_probs"]))
            mixed = np.log(np.array(tok["mixed_probs"]))
            # The independent check: every shot's released mixed distribution within eps0.
            assert np.max(np.abs(mixed - zero)) <= eps0
            assert max(tok["log_ratios"]) <= eps0
            assert tok["divergences"] is None and tok["exact_divergences"] is None
            assert len(tok["exact_log_ratios"]) == 3
            assert max(tok["exact_log_ratios"]) <= 2 * eps0 + 1e-12
            # The released product, recomputed from the mixed rows, is what was reported.
            log_p = mixed.sum(axis=0)
            p = np.exp(log_p - log_p.max())
            assert np.allclose(p / p.sum(), tok["product_probs"], atol=1e-12)
        assert out["max_exact_log_ratio"] <= out["per_token_epsilon"]


def test_debug_noisy_hides_internals(tmp_path: Path) -> None:
    with make_client(tmp_path, whitebox="noisy") as client:
        info = create(client, mozo_context(guarantee="paper"))
        r = generate(client, info["id"], "/v1/debug/generate")
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["whitebox"] == "noisy" and out["tokens"]
        radius = out["beta"] * out["alpha"]
        assert out["radius"] == pytest.approx(radius)
        assert out["per_token_bound"] == pytest.approx(4 * radius)
        for tok in out["tokens"]:
            assert len(tok["top_ids"]) == 20
            assert len(tok["lambdas"]) == 2
            assert all(0.0 <= lam <= 1.5 for lam in tok["lambdas"])
            assert all(max(d) <= radius * (1 + 1e-9) + 1e-12 for d in tok["divergences"])
            for key in (
                "shots",
                "mixed_probs",
                "zero_shot_probs",
                "product_probs",
                "exact_divergences",
                "exact_log_ratios",
            ):
                assert tok[key] is None
        assert out["max_exact_divergence"] is None and out["max_exact_log_ratio"] is None
        assert out["sigma"] is None


def test_debug_internal_has_exact_divergences(tmp_path: Path) -> None:
    with make_client(tmp_path, whitebox="internal") as client:
        info = create(client, mozo_context(lambda_max=1.0, guarantee="paper"))
        out = generate(client, info["id"], "/v1/debug/generate").json()
        assert out["whitebox"] == "internal"
        for tok in out["tokens"]:
            assert all(0.0 <= lam <= 1.0 for lam in tok["lambdas"])
            assert len(tok["shots"]) == len(set(tok["shots"])) == 2
            assert len(tok["mixed_probs"]) == 2
            assert all(abs(sum(row) - 1) < 1e-9 for row in tok["mixed_probs"])
            assert abs(sum(tok["product_probs"]) - 1) < 1e-9
            assert len(tok["exact_divergences"]) == 2
            assert all(len(d) == 2 and min(d) >= 0 for d in tok["exact_divergences"])
        assert out["max_exact_divergence"] >= 0.0


def test_offline_synthesis_then_free_serving(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        info = create(client, mozo_context())
        url = f"/v1/contexts/{info['id']}/synthesize"
        too_many = {"inputs": [f"public input {i}" for i in range(4)]}
        r = client.post(url, json=too_many, headers=admin_headers())
        assert r.status_code == 402 and r.json()["error"]["code"] == "budget_exhausted"
        r = client.post(url, json={"inputs": ["a public input"]}, headers=user_headers())
        assert r.status_code == 401
        r = client.post(
            url,
            json={"inputs": ["public one", "public two"], "name": "syn"},
            headers=admin_headers(),
        )
        assert r.status_code == 201, r.text
        out = r.json()
        assert out["privacy_cost"] == 0 and out["derived_from"] == info["id"]
        assert out["source_budget"]["queries"] == 2
        derived = out["context"]
        assert derived["mechanism"]["name"] == "public"
        assert derived["mechanism"]["derived_from"] == info["id"]
        assert derived["n_exemplars"] == 2 and derived["name"] == "syn"
        for _ in range(5):
            g = generate(client, derived["id"])
            assert g.status_code == 200, g.text
            assert g.json()["cost"]["epsilon"] == 0.0
            assert g.json()["budget"]["spent_epsilon"] == 0.0
        source = client.get(f"/v1/contexts/{info['id']}", headers=admin_headers()).json()
        assert source["spent"]["queries"] == 2  # serving the derived context spent nothing
        assert source["spent"]["remaining_queries"] == 1


@pytest.mark.parametrize(
    ("mech", "param"),
    [
        ({"n_shots": 9}, "mechanism.n_shots"),
        ({"delta": 1.5}, "mechanism.delta"),
        ({"alpha": 1}, "mechanism.alpha"),
        ({"top_k": 0}, "mechanism.top_k"),
        ({"queries": 0}, "mechanism.queries"),
        ({"lambda_max": -1}, "mechanism.lambda_max"),
        ({"epsilon": -1}, "mechanism.epsilon"),
    ],
)
def test_bad_settings_name_the_value(tmp_path: Path, mech: dict[str, Any], param: str) -> None:
    with make_client(tmp_path) as client:
        r = client.post("/v1/contexts", json=mozo_context(**mech), headers=admin_headers())
        assert 400 <= r.status_code < 500, r.text
        err = r.json()["error"]
        assert err["param"] is not None and err["param"].endswith(param.split(".")[-1]), err


def test_wrong_task_and_budget_are_refused(tmp_path: Path) -> None:
    with make_client(tmp_path) as client:
        body = mozo_context() | {"task": "classification", "labels": ["a", "b"]}
        r = client.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == "task"
        body = mozo_context() | {"budget": {"epsilon": 1.0, "delta": 1e-5}}
        r = client.post("/v1/contexts", json=body, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == "budget"
        info = create(client, mozo_context())
        r = client.post(
            "/v1/generate",
            json={"context_id": info["id"], "query": QUERY, "max_tokens": 7},
            headers=user_headers(),
        )
        assert r.status_code == 422 and r.json()["error"]["param"] == "max_tokens"
