"""``POST /v1/zero-shot`` over the real app (oracle engine): the context's template with no
exemplar, for the admin only, at no privacy cost, with or without the white-box routes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dpicl.engines.base import GenerationParams, PromptSpec
from dpicl.engines.oracle.engine import OracleEngine
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import TOPICS, make_client, voting_context

CANARY = "Private record number 3: customer paid invoice 1003"


class RecordingOracle(OracleEngine):
    """The oracle engine, keeping every prompt it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[PromptSpec] = []

    async def score_labels(self, prompts: Sequence[PromptSpec], labels: Sequence[str]) -> Any:
        self.prompts.extend(prompts)
        return await super().score_labels(prompts, labels)

    async def generate(self, prompts: Sequence[PromptSpec], params: GenerationParams) -> list[str]:
        self.prompts.extend(prompts)
        return await super().generate(prompts, params)


def _create(c: Any, body: dict[str, Any]) -> str:
    r = c.post("/v1/contexts", json=body, headers=admin_headers())
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@pytest.mark.parametrize("whitebox", ["off", "internal"])
def test_zero_shot_leaves_the_exemplars_out_and_costs_nothing(
    tmp_path: Path, whitebox: str
) -> None:
    engine = RecordingOracle()
    with make_client(tmp_path, whitebox=whitebox, engine=engine) as c:
        # The canary is among the exemplars: every partition prompt holding it says "Yes";
        # the prompt without exemplars cannot see it and says "No".
        cid = _create(
            c, voting_context(mechanism={"epsilon": 8.0}, budget={"epsilon": 20.0, "delta": 1e-4})
        )
        r = c.post(
            "/v1/zero-shot", json={"context_id": cid, "query": CANARY}, headers=admin_headers()
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body == {
            "context_id": cid,
            "task": "classification",
            "label": "No",
            "text": None,
            "engine": "oracle",
        }
        (prompt,) = engine.prompts
        assert prompt.exemplars == () and "invoice 1003" not in prompt.text.replace(CANARY, "")
        assert prompt.query == CANARY
        # The ledger was not touched.
        info = c.get(f"/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == 0 and info["spent"]["spent_epsilon"] == 0.0


def test_zero_shot_on_a_topic_context_and_a_generation_context(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        labels = sorted({t for _, t in TOPICS})
        topic = _create(
            c,
            {
                "task": "classification",
                "labels": labels,
                "exemplars": [{"input": i, "output": o} for i, o in TOPICS],
                "mechanism": {"name": "voting", "epsilon": 4.0, "partitions": 2},
                "budget": None,
            },
        )
        r = c.post(
            "/v1/zero-shot",
            json={"context_id": topic, "query": TOPICS[1][0]},
            headers=admin_headers(),
        )
        # With no exemplar to match, the oracle scores the first label highest.
        assert r.status_code == 200 and r.json()["label"] == labels[0], r.text
        gen = _create(
            c,
            {
                "task": "generation",
                "exemplars": [
                    {"input": f"dialogue {i}", "output": f"summary {i}"} for i in range(4)
                ],
                "mechanism": {"name": "esa", "epsilon": 4.0, "partitions": 2, "candidates": 2},
                "budget": None,
            },
        )
        r = c.post(
            "/v1/zero-shot",
            json={"context_id": gen, "query": "dialogue 2", "max_tokens": 8},
            headers=admin_headers(),
        )
        # The oracle echoes the query when no exemplar is there to copy.
        assert r.status_code == 200, r.text
        assert r.json()["task"] == "generation" and r.json()["text"] == "dialogue 2"
        assert r.json()["label"] is None


def test_zero_shot_refusals_name_the_value(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        cid = _create(c, voting_context())
        cases = [
            (admin_headers(), {"context_id": cid, "query": "  "}, 422, "query"),
            (admin_headers(), {"context_id": "ctx_nope", "query": "hi"}, 404, "context_id"),
            (
                admin_headers(),
                {"context_id": cid, "query": "hi", "max_tokens": 4},
                422,
                "max_tokens",
            ),
        ]
        for headers, payload, status, param in cases:
            r = c.post("/v1/zero-shot", json=payload, headers=headers)
            assert r.status_code == status, (payload, r.text)
            assert r.json()["error"]["param"] == param
        # A key, even one that reaches the context, may not have the model answer for free.
        r = c.post("/v1/zero-shot", json={"context_id": cid, "query": "hi"}, headers=user_headers())
        assert r.status_code in (401, 403), r.text
        r = c.post("/v1/zero-shot", json={"context_id": cid, "query": "hi"})
        assert r.status_code == 401


def test_the_baseline_samples_as_its_mechanism_says() -> None:
    """The route reads no stored record by key (issue 48): a mechanism's ``sampling`` says
    how its answers sample; by default from its calibration's temperature and max_tokens,
    argmax and the server's default length where it has none (a plug-in's voting variant)."""
    from pydantic import BaseModel

    from dpicl.mechanisms.base import Sampling
    from dpicl.mechanisms.registry import get_mechanism

    esa = get_mechanism("esa")
    cal = esa.calibrate(esa.settings.model_validate({"name": "esa", "epsilon": 1.0}), 10)  # type: ignore[union-attr]
    assert esa.sampling(cal) == Sampling(temperature=cal.temperature, max_tokens=cal.max_tokens)

    class Bare(BaseModel):
        epsilon: float = 1.0

    assert get_mechanism("voting").sampling(Bare()) == Sampling(0.0, None)
