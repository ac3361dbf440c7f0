"""Each mechanism's stored record and its typed calibration (issue 38, item 2), and the
debug responses assembled from each mechanism's debug model (item 2): the record is stored
as it always was, parsed once per loaded context, and read as typed fields; the debug
routes keep their one flat JSON shape while the core knows no mechanism's fields."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

from dpicl.api.routes.debug import DebugClassifyResponse, DebugGenerateResponse, debug_response
from dpicl.errors import ConfigurationError
from dpicl.mechanisms import registry
from dpicl.mechanisms.base import Answering, Mechanism, Outcome
from dpicl.mechanisms.dps_mozo.accounting import MozoCalibration, mozo_cost
from dpicl.mechanisms.dps_mozo.mechanism import DPS_MOZO, MozoSettings
from dpicl.mechanisms.esa.mechanism import ESA, EsaSettings
from dpicl.mechanisms.voting.mechanism import VOTING, VotingSettings
from dpicl.mechanisms.voting.pipeline import VotingCalibration
from dpicl.pipelines.partitions import PartitionLayout
from dpicl.privacy.ledger import Cost
from dpicl.store.records import StoredContext
from dpicl.web.schemas import ClassifyResponse

# The records as the server stored them before the calibrations were typed: the keys, in
# order (what GET /v1/contexts/{id} shows as `mechanism`).
VOTING_KEYS = [
    "epsilon", "delta", "partitions", "partition_seed", "partitioning", "calibration", "name",
    "temperature", "sigma", "sensitivity", "epsilon_exact", "label_calibration",
]  # fmt: skip
ESA_KEYS = [
    "epsilon", "delta", "partitions", "partition_seed", "partitioning", "calibration", "name",
    "sensitivity", "temperature", "candidates", "max_tokens", "sigma", "epsilon_exact",
]  # fmt: skip
MOZO_SETTINGS = [
    "name", "epsilon", "delta", "guarantee", "alpha", "n_shots", "top_k", "max_tokens",
    "queries", "lambda_max",
]  # fmt: skip
MOZO_PROVEN_KEYS = [
    *MOZO_SETTINGS, "max_log_ratio", "per_token_epsilon", "amplified_per_token_epsilon",
    "sample_rate", "tokens",
]  # fmt: skip
MOZO_PAPER_KEYS = [
    *MOZO_SETTINGS, "max_log_ratio", "per_token_epsilon", "beta", "radius", "rdp_epsilon",
    "per_token_rdp", "sample_rate", "tokens",
]  # fmt: skip


def _context(record: dict[str, Any]) -> StoredContext:
    return StoredContext(
        id="ctx_" + "0" * 24,
        name=None,
        task="classification",
        labels=("Yes", "No"),
        exemplars=(("a", "Yes"), ("b", "No")),
        template="{exemplars}{query}",
        mechanism=record,
        budget=None,
        mu2_spent=0.0,
        mu2_max=None,
        queries=0,
        max_queries=None,
        created_at=datetime.now(UTC),
    )


@pytest.mark.parametrize(
    ("mechanism", "settings", "n", "keys"),
    [
        (VOTING, VotingSettings(epsilon=1.0), 20, VOTING_KEYS),
        (ESA, EsaSettings(epsilon=2.0, sensitivity="original"), 20, ESA_KEYS),
        (DPS_MOZO, MozoSettings(epsilon=1.0, queries=3), 20, MOZO_PROVEN_KEYS),
        (
            DPS_MOZO,
            MozoSettings(epsilon=8.0, queries=1, max_tokens=8, guarantee="paper"),
            200,
            MOZO_PAPER_KEYS,
        ),
    ],
)
def test_a_calibration_is_stored_as_the_record_was_and_parses_back(
    mechanism: Mechanism[Any], settings: BaseModel, n: int, keys: list[str]
) -> None:
    cal = mechanism.calibrate(settings, n)
    record = mechanism.record(cal)
    assert list(record) == keys
    assert mechanism.calibration_of(_context(record)) == cal


def test_the_paper_record_stores_its_proven_values_as_null() -> None:
    cal = DPS_MOZO.calibrate(
        MozoSettings(epsilon=8.0, queries=1, max_tokens=8, guarantee="paper"), 200
    )
    record = DPS_MOZO.record(cal)
    assert record["max_log_ratio"] is None and record["per_token_epsilon"] is None
    assert record["alpha"] >= 2 and record["beta"] > 0  # the order chosen is stored


def test_a_record_is_parsed_once_per_loaded_context() -> None:
    record = VOTING.record(VOTING.calibrate(VotingSettings(epsilon=1.0, partitions=2), 2))
    ctx = _context(record)
    cal = VOTING.calibration_of(ctx)
    assert isinstance(cal, VotingCalibration) and cal.sigma == record["sigma"]
    assert VOTING.calibration_of(ctx) is cal
    # The partition kit's layout is the same parse (the calibration extends it) ...
    assert ctx.record_as(PartitionLayout) is cal
    # ... and so is the context after a charge (dataclasses.replace).
    assert VOTING.calibration_of(replace(ctx, queries=1, mu2_spent=0.5)) is cal
    # A context loaded again parses again (the check can fail).
    again = VOTING.calibration_of(_context(record))
    assert again == cal and again is not cal


def test_a_stored_record_is_read_without_the_settings_bounds() -> None:
    # A record is read as stored: a server whose limits changed since still answers it
    # (epsilon 500 is beyond what a request may ask for today).
    record = VOTING.record(VOTING.calibrate(VotingSettings(epsilon=1.0, partitions=2), 2))
    cal = VOTING.calibration_of(_context(record | {"epsilon": 500.0, "temperature": 50}))
    assert cal.epsilon == 500.0 and cal.temperature == 50.0
    with pytest.raises(ValueError, match="sigma"):
        VOTING.calibration_of(_context({k: v for k, v in record.items() if k != "sigma"}))


def test_a_mozo_record_from_before_the_proven_mode_is_a_paper_record() -> None:
    cal = DPS_MOZO.calibrate(
        MozoSettings(epsilon=8.0, queries=1, max_tokens=8, guarantee="paper"), 200
    )
    old = {k: v for k, v in DPS_MOZO.record(cal).items() if k != "guarantee"}
    parsed = MozoCalibration.model_validate(old)
    assert parsed.guarantee == "paper" and not parsed.proven
    assert mozo_cost(parsed).epsilon == mozo_cost(cal).epsilon


def test_the_debug_responses_keep_their_flat_shape() -> None:
    # Classification: voting is the only built-in; its sigma stays required.
    assert DebugClassifyResponse.model_fields["sigma"].is_required()
    assert list(DebugClassifyResponse.model_fields)[-5:] == [
        "whitebox", "sigma", "noisy_votes", "clean_votes", "partition_votes",
    ]  # fmt: skip
    # Generation: ESA's fields, then DPS-MOZO's, each null for the other.
    fields = DebugGenerateResponse.model_fields
    assert list(fields)[list(fields).index("whitebox") + 1 :][:5] == [
        "sigma", "noisy_mean", "candidates", "distances", "clean_mean",
    ]  # fmt: skip
    for name in ("sigma", "noisy_mean", "guarantee", "tokens", "radius"):
        assert not fields[name].is_required(), name
    assert (fields["sigma"].description or "").startswith("esa:")
    assert (fields["tokens"].description or "").startswith("dps-mozo:")


class _View(BaseModel):
    sigma: float
    scale: float = Field(description="The Laplace scale.")
    noisy_votes: list[int]


class _Fake(Mechanism[VotingCalibration]):
    name = "fake"
    task = "classification"
    settings = None
    calibration = VotingCalibration
    debug_model: ClassVar[type[BaseModel] | None] = _View

    def calibrate(self, settings: Any, n_exemplars: int) -> VotingCalibration:
        raise NotImplementedError

    def cost(self, calibration: VotingCalibration) -> Cost:
        raise NotImplementedError

    async def answer(self, context: StoredContext, query: str, how: Answering) -> Outcome:
        raise NotImplementedError


def test_a_mechanisms_debug_fields_join_its_tasks_response(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.MECHANISMS, "fake", _Fake())
    model = debug_response("R", ClassifyResponse, "classification")
    fields = model.model_fields
    # Both declare sigma, required and alike: required.
    assert fields["sigma"].is_required() and fields["sigma"].annotation is float
    # Only the fake has a scale: null for voting, its description naming the fake.
    assert not fields["scale"].is_required() and fields["scale"].description == (
        "fake: The Laplace scale."
    )
    # Declared differently (a dict for voting, a list here): either, or null.
    assert not fields["noisy_votes"].is_required()
    model.model_validate({**_answer(), "whitebox": "noisy", "sigma": 1.0, "noisy_votes": [1]})
    model.model_validate(
        {**_answer(), "whitebox": "noisy", "sigma": 1.0, "noisy_votes": {"a": 1.0}}
    )


def test_a_debug_field_may_not_shadow_the_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    class Shadow(BaseModel):
        label: str

    class Shadowing(_Fake):
        debug_model = Shadow

    monkeypatch.setitem(registry.MECHANISMS, "fake", Shadowing())
    with pytest.raises(ConfigurationError, match=r"'fake'.*'label'"):
        debug_response("R", ClassifyResponse, "classification")


def _answer() -> dict[str, Any]:
    cost = {"epsilon": 1.0, "delta": 0.0, "epsilon_exact": None}
    budget = {
        "queries": 1,
        "spent_epsilon": 1.0,
        "delta": 0.0,
        "remaining_epsilon": None,
        "remaining_queries": None,
    }
    return {"context_id": "c", "label": "Yes", "engine": "oracle", "cost": cost, "budget": budget}
