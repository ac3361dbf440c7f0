"""Typed results (issue 28, item 2): every verdict the auditor ever stored reads back as the
one :class:`~dpicl_audit.verdicts.Verdict` type and writes the same JSON again, exactly.

The verdicts come from the golden runs of today's auditor (``show`` and ``recomputed``, the
stored and the recomputed results) and from the legacy trial log written before issue 9."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.verdicts import (
    EXIT_CODES,
    STATUS_ORDER,
    GaussianVerdict,
    Status,
    Verdict,
    worst_status,
)

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden_runs"


def _stored_results() -> Iterator[tuple[str, Any]]:
    """(where, results JSON) of every golden run's show/recomputed and every legacy run."""
    for path in sorted(GOLDEN.glob("*/*.json")):
        if path.stem in ("show", "recomputed", "run"):
            yield f"{path.parent.name}/{path.name}", json.loads(path.read_text("utf-8"))
    con = sqlite3.connect(FIXTURES / "legacy_trial_log.db")
    try:
        for run_id, results in con.execute("SELECT id, results FROM runs"):
            if results:
                yield f"legacy_trial_log.db:{run_id}", json.loads(results)
    finally:
        con.close()


def _verdicts(value: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every JSON object stored under a ``"verdict"`` key, with its path."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "verdict" and isinstance(v, dict):
                yield f"{path}/{k}", v
            yield from _verdicts(v, f"{path}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _verdicts(v, f"{path}/{i}")


STORED = [(f"{where}{p}", v) for where, res in _stored_results() for p, v in _verdicts(res, "")]


def test_the_fixtures_hold_every_kind_of_verdict() -> None:
    statuses = {v["status"] for _, v in STORED}
    assert {"ok", "violation", "inconclusive"} <= statuses, statuses
    assert any("reasons" in v for _, v in STORED)  # Gaussian verdicts
    assert any("reasons" not in v for _, v in STORED)  # plain ones (DPS-MOZO, RDP, legacy)
    assert any(where.startswith("legacy") for where, _ in STORED)


@pytest.mark.parametrize(("where", "stored"), STORED, ids=[w for w, _ in STORED])
def test_a_stored_verdict_round_trips_exactly(where: str, stored: dict[str, Any]) -> None:
    typed = Verdict.from_dict(stored)
    assert isinstance(typed.status, Status)
    assert isinstance(typed, GaussianVerdict) == ("reasons" in stored)
    assert json.dumps(typed.to_dict(), sort_keys=True) == json.dumps(stored, sort_keys=True)


def test_a_nonconforming_reading_round_trips() -> None:
    conformance = {"status": "nonconforming", "differs": ["release rates"], "message": "m"}
    for alone in (
        Verdict(Status.OK, "fine", violation=False, exceeds_exact=None),
        GaussianVerdict(Status.INCONCLUSIVE, "weak", violation=False, word="INCONCLUSIVE"),
    ):
        read = alone.read_with(conformance)
        assert read.status is Status.NONCONFORMING and read.nonconforming == ("release rates",)
        assert Verdict.from_dict(read.to_dict()) == read
        assert read.to_dict()["verdict"] == "NONCONFORMING"


def test_unknown_keys_are_kept_and_bad_ones_refused() -> None:
    stored = {"status": "ok", "violation": False, "exceeds_exact": None, "message": "m", "x": 1}
    typed = Verdict.from_dict(stored)
    assert typed.extra == {"x": 1} and typed.to_dict() == stored
    with pytest.raises(InvalidAuditInput, match="'fine'"):
        Verdict.from_dict({"status": "fine", "message": "m"})
    with pytest.raises(InvalidAuditInput, match="'MAYBE'"):
        Verdict.from_dict({"status": "ok", "verdict": "MAYBE", "message": "m"})
    with pytest.raises(InvalidAuditInput, match="status"):
        Verdict.from_dict({"message": "m"})


def test_a_status_knows_its_order_and_exit_code() -> None:
    assert [s.order for s in Status] == [5, 4, 3, 2, 1, 0]
    assert {s.value: s.exit_code for s in Status if s.exit_code} == EXIT_CODES
    assert all(STATUS_ORDER[s.value] == s.order for s in Status)
    assert worst_status([]) is Status.ERROR
    assert worst_status(["ok", "inconclusive", ""]) is Status.INCONCLUSIVE
    assert json.dumps({"status": Status.BUG}) == '{"status": "bug"}'  # the JSON keeps its word
