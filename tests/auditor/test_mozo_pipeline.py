"""DPS-MOZO audits in the pipeline against the real server app (oracle engine), in-process
over httpx.ASGITransport: design, trials, resume, white-box per-token internals, estimates.

On the oracle, DPS-MOZO decodes hash-based pseudo-logits, so the audit measures ~nothing
(the module says so); these tests check the plumbing, not the privacy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.datasets import load_dataset
from dpicl_audit.errors import InvalidPlan
from dpicl_audit.mechanisms.dps_mozo.design import decide, mozo_design
from dpicl_audit.pipeline.run import bootstrap_audit, resume_audit, run_audit
from dpicl_audit.plan.schedule import context_slots, trial_worlds
from dpicl_audit.store import TrialStore
from tests.auditor.test_runner import _plan, _server_missing, oracle_server

pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))


def _mozo(**overrides: Any) -> Any:
    base: dict[str, Any] = {
        "mechanism.name": "dps-mozo",
        "mechanism.epsilons": [4.0],
        "mechanism.exemplars": 3,
        "trials": 40,
        "batch_size": 10,
    }
    return _plan(**(base | overrides))


def test_design_is_replace_one() -> None:
    plan = _mozo(**{"mechanism.exemplars": 5, "seed": 3})
    d = mozo_design(plan, load_dataset(plan.dataset))
    assert len(d.exemplars_c1) == len(d.exemplars_c0) == 5
    diff = [
        i for i, (a, b) in enumerate(zip(d.exemplars_c1, d.exemplars_c0, strict=True)) if a != b
    ]
    assert diff == [d.position]
    assert d.exemplars_c1[d.position].input == d.query
    assert d.exemplars_c1[d.position].output == "red"
    assert d.exemplars_c0[d.position].output == "blue"
    assert d.exemplars_c0[d.position].input not in d.query  # absent from C0's view
    assert decide("  red car", "red") == 1 and decide('"Red"', "red") == 1
    assert decide("blue", "red") == 0
    assert type(d).from_json(d.to_json()) == d


def test_plan_checks_mozo_fields() -> None:
    assert _mozo().mechanism.max_tokens == 2 and _mozo().dataset == "dialogsum-mini"
    with pytest.raises(InvalidPlan, match="n_shots"):
        _mozo(**{"mechanism.n_shots": 9})
    with pytest.raises(InvalidPlan, match="brainwash"):
        _mozo(attack="brainwash")
    with pytest.raises(InvalidPlan, match="signal"):
        _mozo(**{"mozo.signals": ["red", "red"]})


def test_context_slots() -> None:
    worlds = trial_worlds(1, 0, 50)
    assert context_slots(worlds, None) == [0] * 50
    slots = context_slots(worlds, 3)
    for w in (0, 1):
        mine = [s for s, x in zip(slots, worlds, strict=True) if x == w]
        assert mine == [j // 3 for j in range(len(mine))]


@pytest.mark.long
async def test_mozo_run_end_to_end_oracle(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/audit.db"
    plan = _mozo()
    async with oracle_server(tmp_path, whitebox="off") as client:
        res = await run_audit(
            plan, db=db, target=client, out_dir=tmp_path / "runs", progress=False, run_id="m"
        )
        left = await client.list_contexts()
    assert left == []  # every spent audit context deleted
    s = res["settings"][0]
    bb = s["black_box"]
    assert bb["tp"] + bb["fn"] + bb["fp"] + bb["tn"] == 40
    assert res["mechanism"] == "dps-mozo" and s["epsilon_exact"] is None
    assert s["guarantee"] == "proven" and not s["nominal"]  # the default: a true claim
    # Issue 27: an attack whose decision never varied had no power: INCONCLUSIVE, not "ok".
    constant = bb["tp"] + bb["fp"] == 0 or bb["fn"] + bb["tn"] == 0
    assert bb["verdict"]["status"] == ("inconclusive" if constant else "ok"), bb["verdict"]
    if constant:
        assert "could not have seen a difference" in bb["verdict"]["message"]
    assert bb["epsilon_emp"] == max(bb["epsilon_lower_classic"], 0.0)
    assert bb["epsilon_emp"] <= s["epsilon_theory"]  # nothing to find on the oracle
    store = TrialStore(db)
    try:
        rows = store.trials("m")
        contexts = store.contexts("m")
    finally:
        store.dispose()
    assert sorted(r.trial_index for r in rows) == list(range(40))
    assert [r.world for r in sorted(rows, key=lambda r: r.trial_index)] == [
        int(w) for w in trial_worlds(plan.seed, 0, 40)
    ]
    assert len(contexts) == 40  # one context per trial (queries_per_context = 1)
    assert len({r.context_id for r in rows}) == 40
    assert all("text" in r.observation and r.decision in (0, 1) for r in rows)


async def test_mozo_shares_contexts_and_white_box_internals(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/audit.db"
    plan = _mozo(
        threat_model="white-box",
        trials=20,
        **{
            "mechanism.guarantee": "paper",
            "mechanism.queries_per_context": 5,
            "mechanism.max_tokens": 1,
            "mechanism.epsilons": [8.0],
            "mechanism.exemplars": 2,
        },
    )
    async with oracle_server(tmp_path, whitebox="internal") as client:
        res = await run_audit(
            plan, db=db, target=client, progress=False, run_id="w", out_dir=tmp_path
        )
    s = res["settings"][0]
    assert s["contexts_used"] == -(-s["n_with"] // 5) + -(-s["n_without"] // 5)
    assert s["epsilon_theory_per_answer"] < s["epsilon_theory"]
    wb = s["white_box"]
    assert wb["kind"] == "divergence" and wb["tokens"] >= 20
    assert wb["max_exact_divergence"] is not None and wb["per_token_bound"] is not None
    assert wb["verdict"]["status"] in ("ok", "violation")
    store = TrialStore(db)
    try:
        rows = store.trials("w")
    finally:
        store.dispose()
    assert all(r.observation["tokens"][0]["lambdas"] for r in rows)


@pytest.mark.long
async def test_mozo_resume_replaces_a_spent_context(tmp_path: Path) -> None:
    """A trial answered but never logged leaves its context spent; resume replaces it."""
    db = f"sqlite:///{tmp_path}/audit.db"
    plan = _mozo(trials=12)
    async with oracle_server(tmp_path, whitebox="off") as client:
        await run_audit(plan, db=db, target=client, progress=False, run_id="r", out_dir=tmp_path)
        store = TrialStore(db)
        try:
            with store.engine.begin() as conn:  # forget three logged trials
                conn.exec_driver_sql(
                    "DELETE FROM trials WHERE run_id='r' AND trial_index IN (2, 5, 7)"
                )
            store.update_run("r", status="interrupted")
        finally:
            store.dispose()
        # their contexts were deleted at completion: resume must recreate them
        res = await resume_audit("r", db=db, target=client, progress=False, out_dir=tmp_path)
    assert res["settings"][0]["trials"] == 12
    store = TrialStore(db)
    try:
        rows = store.trials("r")
    finally:
        store.dispose()
    assert sorted(r.trial_index for r in rows) == list(range(12))


async def test_mozo_has_no_bootstrap(tmp_path: Path) -> None:
    async with oracle_server(tmp_path, whitebox="off") as client:
        with pytest.raises(InvalidPlan, match="no bootstrap"):
            await bootstrap_audit(_mozo(), db=f"sqlite:///{tmp_path}/a.db", target=client)
