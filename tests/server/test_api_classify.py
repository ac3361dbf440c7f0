"""Private voting over the real app: answers, white-box gating, ledger, failures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpicl.engines.base import DecodingSession, GenerationParams, PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from dpicl.errors import EngineError
from dpicl.privacy.accounting import gaussian_mu2
from dpicl.privacy.calibration import gaussian_epsilon
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context

CANARY = "Private record number 3: customer paid invoice 1003"


def _create(c: object, body: dict[str, object]) -> str:
    r = c.post("/v1/contexts", json=body, headers=admin_headers())  # type: ignore[attr-defined]
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_classify_returns_label_cost_and_budget(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        cid = _create(c, voting_context(mechanism={"epsilon": 8.0}))
        r = c.post(
            "/v1/classify", json={"context_id": cid, "query": CANARY}, headers=user_headers()
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["label"] in ("Yes", "No")
        assert body["engine"] == "oracle"
        assert body["cost"]["epsilon"] == 8.0
        assert body["cost"]["delta"] == 1e-5
        assert 0 < body["cost"]["epsilon_exact"] <= 8.0
        assert body["budget"]["queries"] == 1
        assert body["budget"]["remaining_epsilon"] is None
        for key in ("noisy_votes", "clean_votes", "partition_votes"):
            assert key not in body


def test_classify_input_errors(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        cid = _create(c, voting_context())
        cases = [
            ({"context_id": cid, "query": "   "}, 422, "query"),
            ({"context_id": "ctx_nope", "query": "hi"}, 404, "context_id"),
            ({"context_id": cid}, 422, "query"),
            ({"context_id": cid, "query": "x" * 9000}, 422, "query"),
        ]
        for payload, status, param in cases:
            r = c.post("/v1/classify", json=payload, headers=user_headers())
            assert r.status_code == status, (payload, r.text)
            assert r.json()["error"]["param"] == param
        r = c.post("/v1/classify", json={"context_id": cid, "query": "hi"})
        assert r.status_code == 401
        # None of the refused calls was charged.
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == 0


def test_debug_route_absent_when_whitebox_off(tmp_path: Path) -> None:
    with make_client(tmp_path, whitebox="off") as c:
        cid = _create(c, voting_context())
        r = c.post(
            "/v1/debug/classify", json={"context_id": cid, "query": CANARY}, headers=admin_headers()
        )
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"


def test_debug_noisy_and_internal(tmp_path: Path) -> None:
    with make_client(tmp_path, whitebox="noisy") as c:
        cid = _create(c, voting_context())
        r = c.post(
            "/v1/debug/classify", json={"context_id": cid, "query": CANARY}, headers=user_headers()
        )
        assert r.status_code == 401, "debug needs the admin token, not a user key"
        r = c.post(
            "/v1/debug/classify", json={"context_id": cid, "query": CANARY}, headers=admin_headers()
        )
        body = r.json()
        assert set(body["noisy_votes"]) == {"Yes", "No"}
        assert body["clean_votes"] is None and body["partition_votes"] is None
    with make_client(tmp_path / "i", whitebox="internal") as c:
        cid = _create(c, voting_context())
        body = c.post(
            "/v1/debug/classify", json={"context_id": cid, "query": CANARY}, headers=admin_headers()
        ).json()
        # The oracle sees the canary in exactly one of the 4 partitions.
        assert body["clean_votes"] == {"Yes": 1, "No": 3}
        assert sorted(body["partition_votes"]) == ["No", "No", "No", "Yes"]


def test_noise_scale_through_debug_endpoint_matches_sigma(tmp_path: Path) -> None:
    """Var(noisy - clean) = sigma^2. Two-sided chi-square interval on the sample variance,
    false-failure rate 1e-4 (independent samples: 2 labels x 300 calls)."""
    n_calls = 300
    with make_client(tmp_path, whitebox="internal") as c:
        cid = _create(c, voting_context(mechanism={"epsilon": 2.0}))
        diffs = []
        sigma = None
        for _ in range(n_calls):
            b = c.post(
                "/v1/debug/classify",
                json={"context_id": cid, "query": CANARY},
                headers=admin_headers(),
            ).json()
            sigma = b["sigma"]
            diffs += [b["noisy_votes"][k] - b["clean_votes"][k] for k in ("Yes", "No")]
    d = np.asarray(diffs)
    n = d.size
    assert sigma == pytest.approx(2 * math.sqrt(math.log(1.25 / 1e-5)) / 2.0)
    stat = float(np.sum(d**2)) / sigma**2  # mean is known to be 0: chi2 with n dof
    lo, hi = stats.chi2.ppf([0.5e-4, 1 - 0.5e-4], n)
    assert lo < stat < hi, (stat, lo, hi)


def test_budget_allows_exactly_k_then_refuses_without_charging(tmp_path: Path) -> None:
    eps, delta, k = 1.0, 1e-5, 5
    sigma = 2 * math.sqrt(math.log(1.25 / delta)) / eps
    # The exact budget of k Gaussian answers: mu_total = sqrt(k) * sensitivity / sigma.
    budget_eps = gaussian_epsilon(delta, math.sqrt(k * gaussian_mu2(sigma, math.sqrt(2))))
    with make_client(tmp_path) as c:
        cid = _create(c, voting_context(budget={"epsilon": budget_eps, "delta": delta}))
        remaining = []
        for _ in range(k):
            r = c.post(
                "/v1/classify", json={"context_id": cid, "query": CANARY}, headers=user_headers()
            )
            assert r.status_code == 200, r.text
            remaining.append(r.json()["budget"]["remaining_queries"])
        assert remaining == [k - 1 - i for i in range(k)]
        # Tight composition: k answers cost far less than k * epsilon.
        assert budget_eps < 0.6 * k * eps
        for _ in range(3):
            r = c.post(
                "/v1/classify", json={"context_id": cid, "query": CANARY}, headers=user_headers()
            )
            assert r.status_code == 402
            assert r.json()["error"]["code"] == "budget_exhausted"
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == k
        assert info["spent"]["spent_epsilon"] == pytest.approx(budget_eps, rel=1e-6)


class FailingEngine(OracleEngine):
    """A real oracle whose label scoring fails, as a crashed model server would."""

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> np.ndarray:
        raise RuntimeError("CUDA error: device lost")

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        raise RuntimeError("CUDA error: device lost")

    async def open_decoding(
        self, prompts: Sequence[PromptSpec], *, zero_shot_index: int, top_k: int
    ) -> DecodingSession:
        raise EngineError("device lost")


class NanOnOnePartition(OracleEngine):
    """The oracle, except that the first partition's scores are NaN (failed numerics)."""

    async def score_labels(
        self, prompts: Sequence[PromptSpec], labels: Sequence[str]
    ) -> np.ndarray:
        scores = np.array(await super().score_labels(prompts, labels), dtype=np.float64)
        scores[0] = np.nan
        return scores


def test_a_partition_with_unusable_scores_abstains(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a 500: the failure would be a bit computed from the private prompts, released
    outside the noise. The answer is charged as usual and the operator's log says so."""
    with make_client(tmp_path, whitebox="internal", engine=NanOnOnePartition()) as c:
        cid = _create(c, voting_context(budget={"epsilon": 3.0, "delta": 1e-5}))
        r = c.post(
            "/v1/debug/classify", json={"context_id": cid, "query": CANARY}, headers=admin_headers()
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["partition_votes"][0] is None
        assert None not in body["partition_votes"][1:]
        assert sum(body["clean_votes"].values()) == 3
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == 1
    assert "1 of 4 partitions" in caplog.text and "abstained" in caplog.text


def test_engine_failure_is_503_and_charges_nothing(tmp_path: Path) -> None:
    with make_client(tmp_path, engine=FailingEngine()) as c:
        cid = _create(c, voting_context(budget={"epsilon": 3.0, "delta": 1e-5}))
        r = c.post(
            "/v1/classify", json={"context_id": cid, "query": CANARY}, headers=user_headers()
        )
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "engine_unavailable"
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == 0
        assert info["spent"]["spent_epsilon"] == 0.0
