"""ESA against a server as deployed (no DPICL_ALLOW_UNBUDGETED, issue 27 item 5): a world whose
trials need more than the largest budget a server takes is spread over several identical
budgeted contexts (slots), as voting's are; e(y1), e(y0) are learnt once from the first pair
and every slot's trials use them; an interrupted run resumes from its log into the same slots.

The real app runs in this process (oracle engine, httpx.ASGITransport); the point is the
auditor's context planning, so the oracle's rule-following answers are enough. At epsilon 32
one context holds 57 planned trials (ledger.answers_within_budget), so 150 trials (about 75
per world) need two contexts per world.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.errors import TargetUnavailable
from dpicl_audit.estimators.composition import answers_within_budget
from dpicl_audit.mechanisms.esa.audit import ESA
from dpicl_audit.pipeline.run import bootstrap_audit, resume_audit, run_audit
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.budgets import context_capacity
from dpicl_audit.plan.schedule import context_slots, trial_worlds
from dpicl_audit.store import TrialStore
from tests.auditor.test_runner import _server_missing
from tests.servers import FailsAfter, app_client, target_plan

pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))

EPS = 32.0
SETTING = "eps=32"
FLAGS: dict[str, Any] = {
    "mechanism.name": "esa",
    "mechanism.partitions": 2,
    "mechanism.shots": 2,
    "mechanism.epsilons": [EPS],
    "trials": 150,
    "batch_size": 10,
    "concurrency": 4,
    "seed": 3,
}


def _plan(**flags: Any) -> AuditPlan:
    return target_plan("http://dpicl.test", **(FLAGS | flags))


def production(tmp_path: Path, whitebox: str = "internal") -> Any:
    """The real app as deployed: unbudgeted contexts refused (the server's default)."""
    return app_client(
        f"sqlite:///{tmp_path}/server-{whitebox}.db", whitebox=whitebox, allow_unbudgeted=False
    )


def _slots_used(store: TrialStore, run_id: str) -> dict[tuple[str, int], str]:
    return {k: rec.context_id for k, rec in store.contexts(run_id).items()}


def _check_trials(store: TrialStore, run_id: str, plan: AuditPlan, *, scored: bool) -> None:
    """Every trial index once, each in the context its slot says, scored where white-box."""
    rows = store.trials(run_id, SETTING)
    assert [r.trial_index for r in rows] == list(range(plan.trials))
    worlds = trial_worlds(plan.seed, 0, plan.trials)
    slots = context_slots(worlds, ESA.queries_per_context(plan))
    ids = _slots_used(store, run_id)
    for r in rows:
        key = SETTING if slots[r.trial_index] == 0 else f"{SETTING}#{slots[r.trial_index]}"
        assert r.world == int(worlds[r.trial_index])
        assert r.context_id == ids[(key, r.world)], (r.trial_index, key)
        assert (r.score is not None) == scored
    per_context = Counter(r.context_id for r in rows)
    assert max(per_context.values()) <= answers_within_budget(EPS, plan.mechanism.delta)


def test_esa_plans_slots_like_voting() -> None:
    """ESA's queries per context are voting's: None where one pair holds the trials."""
    plan = _plan()
    cap = answers_within_budget(EPS, plan.mechanism.delta)
    assert cap < 75 and ESA.queries_per_context(plan) == context_capacity(plan) == cap
    assert ESA.learns_from_contexts
    small = _plan(trials=100, **{"mechanism.epsilons": [8.0]})
    assert ESA.queries_per_context(small) is None
    # ESA's default plan (1000 trials at epsilons 1 to 8) fits one pair; 2000 trials need
    # slots at epsilon 8 (about 1000 per world, 559 per context). Either way every context is
    # budgeted: none is above the largest budget a server takes (it would go unbudgeted).
    for trials in (None, 2000):
        more = {} if trials is None else {"trials": trials}
        p = target_plan("http://dpicl.test", **{"mechanism.name": "esa"}, **more)
        assert (ESA.queries_per_context(p) is None) == (trials is None)
        for eps in p.mechanism.epsilons:
            for world in (1, 0):
                assert ESA.context_budget(p, eps, world) is not None, (trials, eps)


@pytest.mark.parametrize("threat_model", ["white-box", "black-box"])
@pytest.mark.long
async def test_esa_uses_slots_against_a_production_server(
    tmp_path: Path, threat_model: str
) -> None:
    plan = _plan(threat_model=threat_model)
    db = f"sqlite:///{tmp_path}/a.db"
    async with production(tmp_path) as client:
        res = await run_audit(
            plan, db=db, target=client, run_id="s", out_dir=tmp_path, progress=False
        )
        left = await client.list_contexts()
    store = TrialStore(db)
    ids = _slots_used(store, "s")
    # two contexts per world, each budgeted (the server refuses any other)
    assert set(ids) == {(SETTING, 1), (SETTING, 0), (f"{SETTING}#1", 1), (f"{SETTING}#1", 0)}
    assert len(set(ids.values())) == 4
    assert all(rec.info.get("budget") for rec in store.contexts("s").values())
    _check_trials(store, "s", plan, scored=threat_model == "white-box")
    assert store.get_run("s").status == "completed"
    store.dispose()
    # e(y1), e(y0) learnt once, on the server, from the first pair
    assert res["design"]["embeddings_source"] == "server"
    (s,) = res["settings"]
    assert s["trials"] == plan.trials
    # the results name the first pair, in the shape of a one-pair run
    assert s["context_ids"] == {"C1": ids[(SETTING, 1)], "C0": ids[(SETTING, 0)]}
    key = "white_box" if threat_model == "white-box" else "black_box"
    assert s[key]["verdict"]["status"] not in ("violation", "bug"), s[key]
    # spent slots are deleted after the run, the ledger's probe too
    assert not {c["id"] for c in left} & set(ids.values())
    assert res["ledger"]["status"] == "ok", res["ledger"]


async def test_interrupted_esa_run_resumes_into_its_slots(tmp_path: Path) -> None:
    plan = _plan(threat_model="white-box")
    db = f"sqlite:///{tmp_path}/a.db"
    async with production(tmp_path) as client:
        flaky = FailsAfter(client, 130, "debug_generate")  # past the first slot of either world
        with pytest.raises(TargetUnavailable, match="injected"):
            await run_audit(plan, db=db, target=flaky, run_id="r", out_dir=tmp_path, progress=False)
        store = TrialStore(db)
        assert store.get_run("r").status == "failed"
        before = _slots_used(store, "r")
        done = store.trial_indices("r", SETTING)
        assert 100 <= len(done) < plan.trials
        assert (f"{SETTING}#1", 1) in before or (f"{SETTING}#1", 0) in before
        design = store.get_run("r").design
        counting = FailsAfter(client, 10**6, "debug_generate")
        res = await resume_audit(
            "r", store=store, target=counting, out_dir=tmp_path, progress=False
        )
        after = _slots_used(store, "r")
    # the contexts the log recorded are reused; the missing trials alone were asked (no
    # second learning of e(y1), e(y0): the run's design holds them)
    assert all(after[k] == v for k, v in before.items())
    assert len(after) == 4
    assert counting.calls == plan.trials - len(done)
    assert store.get_run("r").design == design
    _check_trials(store, "r", plan, scored=True)
    assert store.get_run("r").status == "completed"
    assert res["settings"][0]["trials"] == plan.trials
    store.dispose()


async def test_esa_bootstrap_against_a_production_server(tmp_path: Path) -> None:
    """The bootstrap collection (white-box at internal) fits its budgeted contexts too."""
    plan = _plan(**{"bootstrap.n_llm": 70, "bootstrap.n_sample": 20_000})
    db = f"sqlite:///{tmp_path}/b.db"
    async with production(tmp_path) as client:
        res = await bootstrap_audit(plan, db=db, target=client, out_dir=tmp_path, progress=False)
    store = TrialStore(db)
    keys = set(_slots_used(store, res["run_id"]))
    # 70 clean rows per world, 57 per context: a second slot each
    assert {(SETTING, 1), (SETTING, 0), (f"{SETTING}#1", 1), (f"{SETTING}#1", 0)} <= keys
    assert len(store.trials(res["run_id"], "clean")) == 140
    store.dispose()
    assert res["design"]["embeddings_source"] == "server"
    assert res["settings"][0]["noise_check"]["consistent"]
