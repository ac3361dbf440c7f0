"""Typed results (issue 28, item 2): every verdict the auditor ever stored reads back as the
one :class:`~dpicl_audit.verdicts.Verdict` type and writes the same JSON again, exactly.

The verdicts come from the golden runs of today's auditor (``show`` and ``recomputed``, the
stored and the recomputed results) and from the legacy trial log written before issue 9."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.errors import InvalidAuditInput
from dpicl_audit.pipeline.estimation import load_run
from dpicl_audit.results import Estimate, RunResult
from dpicl_audit.store import TrialStore
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


# ------------------------------------------------------------------ a run's results


@pytest.mark.parametrize(("where", "stored"), list(_stored_results()), ids=lambda w: str(w)[:60])
def test_stored_results_round_trip_exactly(where: str, stored: dict[str, Any]) -> None:
    typed = RunResult.from_json(stored)
    again = typed.to_json()
    assert again == stored, where
    assert list(again) == list(stored)  # in the stored order too
    for s, s_stored in zip(typed.settings, stored.get("settings") or [], strict=True):
        assert list(s.to_json()) == list(s_stored)
        for key in ("black_box", "white_box"):
            est = s.estimate(key)
            if isinstance(s_stored.get(key), dict):
                assert est is not None and est.to_json() == s_stored[key]
                assert est.mu_lower == s_stored[key].get("mu_lower")


def test_a_run_reads_as_attributes() -> None:
    shown = json.loads((GOLDEN / "golden-broken-bb" / "show.json").read_text("utf-8"))
    run = RunResult.from_json(shown)
    assert run.run_id == "golden-broken-bb" and run.mechanism == "voting"
    assert [s.setting for s in run.settings] == [s["setting"] for s in shown["settings"]]
    bb = run.settings[0].black_box
    assert bb is not None and bb.verdict is not None and bb.status == "violation"
    assert bb.tp == shown["settings"][0]["black_box"]["tp"]
    assert Status.VIOLATION in run.statuses()
    verify = RunResult.from_json(json.loads((GOLDEN / "golden-verify" / "run.json").read_text()))
    assert verify.tail_gap is not None and verify.tail_gap.run_id == "golden-verify-tail"
    assert "verify" not in verify.extra


def test_non_finite_figures_read_as_floats_and_write_back_as_strings() -> None:
    est = Estimate.from_json({"mu_lower": "inf", "epsilon_lower": 0, "verdict": None})
    assert est.mu_lower == math.inf and est.epsilon_lower == 0
    assert est.to_json() == {"mu_lower": "inf", "epsilon_lower": 0, "verdict": None}
    with pytest.raises(InvalidAuditInput, match="'many'"):
        Estimate.from_json({"tp": "many"})
    assert Estimate(error="boom").status == "error" and Estimate().status == ""


def test_legacy_runs_upgraded_read_back_exactly(tmp_path: Path) -> None:
    """The legacy log's runs as the pipeline reads them (pipeline.legacy upgrades their
    results) go through the typed results and back unchanged, with their verdicts typed."""
    db = tmp_path / "legacy.db"
    shutil.copy(FIXTURES / "legacy_trial_log.db", db)
    store = TrialStore(f"sqlite:///{db}")
    try:
        upgraded = [load_run(store, r.id) for r in store.list_runs()]
    finally:
        store.dispose()
    typed = [(r.id, RunResult.from_json(r.results)) for r in upgraded if r.results is not None]
    assert len(typed) >= 4
    for run_id, run in typed:
        stored = next(r.results for r in upgraded if r.id == run_id)
        assert run.to_json() == stored, run_id
        assert all(isinstance(v, Verdict) for v in run.verdicts())
    assert any(run.verdicts() for _, run in typed)
