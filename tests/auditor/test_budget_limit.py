"""The auditor plans within the largest budget the server takes (issue 27 item 5).

A server configured with DPICL_MAX_BUDGET_EPSILON below 1000 publishes it in its /healthz
(``limits``); the auditor reads it when a run starts, stores it resolved in the run's plan
(``target.max_budget_epsilon``) and sizes every context within it, spreading a world's trials
(or a bootstrap's clean rows) over as many budgeted contexts (slots) as that takes. A resumed
run plans the same contexts whatever the server says then; a server that publishes no limit
(an older one) is planned for 1000, as before.

The real app runs in this process (oracle engine, httpx.ASGITransport) as deployed:
unbudgeted contexts refused, ``max_budget_epsilon = 50``. At epsilon 8 such a budget holds
16 answers, so a context is planned for 6 trials and 40 trials need several contexts a world.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dpicl_audit.errors import InvalidPlan, TargetProtocolError, TargetUnavailable
from dpicl_audit.estimators.composition import (
    MAX_BUDGET_EPSILON,
    answers_in_budget,
    answers_within_budget,
    budget_for,
    most_that_fit,
    planned_queries,
    trials_held,
)
from dpicl_audit.mechanisms.voting.audit import VOTING, VotingAudit
from dpicl_audit.pipeline.run import bootstrap_audit, resume_audit, run_audit
from dpicl_audit.pipeline.session import with_budget_limit
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.budgets import (
    budget_limit,
    clean_rows,
    context_capacity,
    published_budget_limit,
)
from dpicl_audit.plan.schedule import context_slots, trial_worlds
from dpicl_audit.store import TrialStore
from tests.auditor.test_runner import _server_missing
from tests.servers import FailsAfter, app_client, target_plan

pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))

LIMIT = 50.0
FLAGS: dict[str, Any] = {
    "mechanism.epsilons": [4.0, 8.0],
    "mechanism.partitions": 2,
    "mechanism.shots": 2,
    "trials": 40,
    "batch_size": 5,
    "concurrency": 4,
    "seed": 5,
}


def _plan(**flags: Any) -> AuditPlan:
    return target_plan("http://dpicl.test", **(FLAGS | flags))


def _at(plan: AuditPlan, limit: float | None) -> AuditPlan:
    """``plan`` as a run stores it after reading a server that publishes ``limit``."""
    return plan.model_copy(update={"target": with_budget_limit(plan.target, _health(limit))})


def _health(limit: float | None, allow: bool = False) -> dict[str, Any]:
    base: dict[str, Any] = {"status": "ok", "simulator": True}
    if limit is None:
        return base  # a server older than the published limits
    return base | {"limits": {"max_budget_epsilon": limit, "allow_unbudgeted": allow}}


def deployed(tmp_path: Path, limit: float | None = LIMIT, whitebox: str = "off") -> Any:
    """The real app as deployed, its largest budget ``limit`` (None: the default, 1000)."""
    extra = {} if limit is None else {"max_budget_epsilon": limit}
    return app_client(
        f"sqlite:///{tmp_path}/server.db", whitebox=whitebox, allow_unbudgeted=False, **extra
    )


def _check_budgets(store: TrialStore, run_id: str, plan: AuditPlan, limit: float) -> None:
    """Every context of the run budgeted within ``limit``; no context asked more trials than
    the capacity the plan gives it."""
    recs = store.contexts(run_id)
    assert recs
    for key, rec in recs.items():
        budget = rec.info.get("budget")
        assert budget and budget["epsilon"] <= limit, (key, budget)
    cap = VOTING.queries_per_context(plan)
    assert cap is not None
    per_context = Counter(r.context_id for r in store.trials(run_id))
    assert max(per_context.values()) <= cap


# ------------------------------------------------------------------ the limit, read and stored


def test_the_published_limit_is_read_and_an_unpublished_one_falls_back_to_1000() -> None:
    assert published_budget_limit(_health(LIMIT)) == LIMIT
    for older in (_health(None), None, {"limits": {"allow_unbudgeted": False}}):
        assert published_budget_limit(older) is None
    for bad in ("50", 0, -1.0, float("nan"), True):
        with pytest.raises(TargetProtocolError, match="max_budget_epsilon"):
            published_budget_limit({"limits": {"max_budget_epsilon": bad}})
    plan = _plan()
    assert plan.target.max_budget_epsilon is None and budget_limit(plan) == MAX_BUDGET_EPSILON
    assert _at(plan, None).target.max_budget_epsilon == MAX_BUDGET_EPSILON
    assert _at(plan, LIMIT).target.max_budget_epsilon == LIMIT
    # a limit the plan gives is kept where the server's is higher, and lowered where not
    given = _plan(**{"target.max_budget_epsilon": 30.0})
    assert _at(given, LIMIT).target.max_budget_epsilon == 30.0
    assert _at(given, 20.0).target.max_budget_epsilon == 20.0
    # the resolved limit is stored with the plan and read back as it was
    stored = AuditPlan.from_public(_at(plan, LIMIT).public_dump())
    assert budget_limit(stored) == LIMIT


def test_capacity_and_budgets_fit_the_servers_limit() -> None:
    plan = _plan()
    assert context_capacity(plan) is None  # 1000: one pair per epsilon holds 20 trials a world
    low = _at(plan, LIMIT)
    cap = answers_within_budget(8.0, 1e-5, LIMIT)
    assert answers_in_budget(8.0, 1e-5, LIMIT) == 16 and cap == 6
    assert context_capacity(low) == VOTING.queries_per_context(low) == cap
    for eps in low.mechanism.epsilons:
        for world in (1, 0):
            budget = VOTING.context_budget(low, eps, world)
            assert budget is not None and budget["epsilon"] <= LIMIT, (eps, world)
    # where not even the retry margin of one trial fits (epsilon 16: 5 answers in 50), a
    # context is budgeted for all it holds and planned for half of it
    tight = _at(_plan(**{"mechanism.epsilons": [16.0]}), LIMIT)
    assert answers_in_budget(16.0, 1e-5, LIMIT) == 5 and context_capacity(tight) == 2
    assert VOTING.planned_answers(tight, 16.0, 1) == 5
    assert budget_for(16.0, 1e-5, 6, LIMIT) is None
    assert VOTING.context_budget(tight, 16.0, 1) is not None


def test_capacity_counts_a_bootstraps_clean_rows() -> None:
    """A bootstrap's clean rows of an epsilon (pair j goes to epsilon j mod K) that need more
    than one budget spread over slots, even where the trials fit one context."""
    plan = _plan(**{"trials": 10, "bootstrap.n_llm": 30, "mechanism.epsilons": [8.0]})
    assert clean_rows(plan, 0) == 30
    assert context_capacity(plan) is None  # 30 rows fit one context at 1000
    low = _at(plan, LIMIT)
    assert context_capacity(low) == 6
    assert VOTING.context_budget(low, 8.0, 1) is not None
    two = _plan(**{"bootstrap.n_llm": 31})
    assert [clean_rows(two, k) for k in (0, 1)] == [16, 15]


def test_most_that_fit_finds_the_boundary_in_few_calls() -> None:
    for n in (0, 1, 2, 3, 7, 8, 1000, 596, 81829, 2**40 + 5):
        asked: list[int] = []

        def fits(m: int, n: int = n, asked: list[int] = asked) -> bool:
            asked.append(m)
            return m <= n

        assert most_that_fit(fits) == min(n, 2**40), n
        assert len(asked) <= 2 * max(n, 1).bit_length() + 2, (n, len(asked))


def test_the_gaussian_capacity_is_the_mu_gdp_count_as_before() -> None:
    """The generic search over a mechanism's own budgets (answers_held) gives the Gaussian
    mechanisms exactly the closed form's count, so their slots and budgets are unchanged."""
    for limit in (None, LIMIT, 5.0):
        plan = _at(_plan(), limit)
        for eps in (0.5, 1.0, 4.0, 8.0, 16.0):
            got = VOTING.answers_held(plan, eps)
            assert got == answers_in_budget(eps, 1e-5, budget_limit(plan)), (limit, eps)


class _PureBasic(VotingAudit):
    """A mechanism from outside whose answers compose as pure epsilon-DP answers add up
    (answers x epsilon): it overrides only answers_budget, nothing of the budgets code."""

    def answers_budget(
        self, plan: AuditPlan, epsilon: float, answers: int
    ) -> dict[str, float] | None:
        total = answers * epsilon
        return None if total > budget_limit(plan) else {"epsilon": total, "delta": 1e-5}


def test_a_mechanism_with_its_own_composition_gets_slots_and_a_retry_margin() -> None:
    """At the server's default limit (1000) a world's 500 trials at epsilon 8 fit one
    Gaussian budget but not 8 x 500 of basic composition: the mechanism's own count (125
    answers) sizes its contexts, every one budgeted within the limit with the retry margin,
    and the world's trials are spread over several slots."""
    pure = _PureBasic()
    plan = _plan(trials=1000)
    assert VOTING.queries_per_context(plan) is None  # mu-GDP: one pair per epsilon
    assert pure.answers_held(plan, 8.0) == 125 and pure.answers_held(plan, 4.0) == 250
    cap = pure.queries_per_context(plan)
    assert cap == trials_held(125) and planned_queries(cap) <= 125
    for k, eps in enumerate(plan.mechanism.epsilons):
        worlds = trial_worlds(plan.seed, k, plan.trials)
        slots = context_slots(worlds, cap)
        for world in (1, 0):
            answers = pure.planned_answers(plan, eps, world)
            assert answers == planned_queries(cap), (eps, world)
            budget = pure.context_budget(plan, eps, world)
            assert budget is not None and answers * eps <= budget["epsilon"] <= 1000.0
            assert len({s for s, w in zip(slots, worlds, strict=True) if w == world}) >= 4


# ------------------------------------------------------------------ against a deployed server


async def test_a_run_against_a_server_with_a_low_limit_spreads_over_budgeted_slots(
    tmp_path: Path,
) -> None:
    plan = _plan()
    db = f"sqlite:///{tmp_path}/a.db"
    async with deployed(tmp_path) as client:
        health = await client.health()
        assert health["limits"]["max_budget_epsilon"] == LIMIT
        assert health["limits"]["allow_unbudgeted"] is False
        res = await run_audit(
            plan, db=db, target=client, run_id="low", out_dir=tmp_path, progress=False
        )
    store = TrialStore(db)
    run = store.get_run("low")
    assert run.status == "completed"
    # the limit read is recorded with the run: in its plan (resolved) and its health
    assert run.plan["target"]["max_budget_epsilon"] == LIMIT
    assert run.versions["server"]["limits"]["max_budget_epsilon"] == LIMIT
    stored = AuditPlan.from_public(run.plan)
    _check_budgets(store, "low", stored, LIMIT)
    # several slots per world at each epsilon, every trial in the slot the schedule says
    keys = set(store.contexts("low"))
    cap = VOTING.queries_per_context(stored)
    for k, eps in enumerate(stored.mechanism.epsilons):
        setting = stored.setting_key(eps)
        worlds = trial_worlds(stored.seed, k, stored.trials)
        slots = context_slots(worlds, cap)
        for world in (1, 0):
            used = {s for s, w in zip(slots, worlds, strict=True) if w == world}
            assert len(used) >= 3, (eps, world, used)
            for s in used:
                assert ((setting if s == 0 else f"{setting}#{s}"), world) in keys
        assert len(store.trials("low", setting)) == stored.trials
    store.dispose()
    for s in res["settings"]:
        assert s["black_box"]["verdict"]["status"] not in ("violation", "bug"), s
    assert res["ledger"]["status"] == "ok", res["ledger"]
    assert res["ledger"]["budget"]["epsilon"] <= LIMIT


async def test_a_resumed_run_plans_with_the_limit_it_started_with(tmp_path: Path) -> None:
    """Interrupted against the server with limit 50 and resumed against it restarted with
    the default 1000: the resume keeps the stored limit, so its new contexts are the slots
    the run planned, budgeted within 50."""
    plan = _plan(**{"mechanism.epsilons": [8.0]})
    db = f"sqlite:///{tmp_path}/a.db"
    async with deployed(tmp_path) as client:
        flaky = FailsAfter(client, 12, "classify")
        with pytest.raises(TargetUnavailable, match="injected"):
            await run_audit(plan, db=db, target=flaky, run_id="r", out_dir=tmp_path, progress=False)
    store = TrialStore(db)
    assert store.get_run("r").status == "failed"
    before = {k: rec.context_id for k, rec in store.contexts("r").items()}
    done = store.trial_indices("r", "eps=8")
    assert 0 < len(done) < plan.trials
    async with deployed(tmp_path, limit=None) as client:
        assert (await client.health())["limits"]["max_budget_epsilon"] == MAX_BUDGET_EPSILON
        counting = FailsAfter(client, 10**6, "classify")
        res = await resume_audit(
            "r", store=store, target=counting, out_dir=tmp_path, progress=False
        )
    run = store.get_run("r")
    assert run.status == "completed"
    assert run.plan["target"]["max_budget_epsilon"] == LIMIT
    after = {k: rec.context_id for k, rec in store.contexts("r").items()}
    assert all(after[k] == v for k, v in before.items())
    # the missing trials alone, the ledger probe's answers and its refusal, and the tail
    # probe's answers (mechanisms.voting.tails: on contexts of its own)
    probe = res["ledger"]["answers"] + 1 + res["tails"]["answers"]
    assert res["ledger"]["status"] == "ok" and counting.calls == plan.trials - len(done) + probe
    stored = AuditPlan.from_public(run.plan)
    _check_budgets(store, "r", stored, LIMIT)
    worlds = trial_worlds(stored.seed, 0, stored.trials)
    assert len(after) == len(set(zip(context_slots(worlds, 6), worlds, strict=True)))
    store.dispose()


async def test_a_bootstrap_whose_clean_rows_need_several_budgets_uses_slots(
    tmp_path: Path,
) -> None:
    plan = _plan(
        **{
            "mechanism.epsilons": [8.0],
            "trials": 10,
            "bootstrap.n_llm": 20,
            "bootstrap.n_sample": 2_000,
        }
    )
    db = f"sqlite:///{tmp_path}/b.db"
    async with deployed(tmp_path, whitebox="internal") as client:
        res = await bootstrap_audit(
            plan, db=db, target=client, run_id="b", out_dir=tmp_path, progress=False
        )
    store = TrialStore(db)
    assert store.get_run("b").status == "completed"
    keys = set(store.contexts("b"))
    # 20 clean rows a world, 6 a context: four slots each
    assert {(s, w) for s in ("eps=8", "eps=8#1", "eps=8#2", "eps=8#3") for w in (1, 0)} <= keys
    assert len(store.trials("b", "clean")) == 40
    _check_budgets(store, "b", AuditPlan.from_public(store.get_run("b").plan), LIMIT)
    store.dispose()
    assert res["settings"][0]["noise_check"]["status"] in ("consistent", "inconclusive")


async def test_a_plan_that_needs_an_unbudgeted_context_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    """At epsilon 64 one answer costs more than 50: the server would refuse the context, so
    the run does not start (and leaves no log)."""
    plan = _plan(**{"mechanism.epsilons": [64.0]})
    db = f"sqlite:///{tmp_path}/c.db"
    async with deployed(tmp_path) as client:
        with pytest.raises(InvalidPlan, match=r"epsilon \[64\.0\].*epsilon 50 "):
            await run_audit(plan, db=db, target=client, out_dir=tmp_path, progress=False)
        assert await client.list_contexts() == []
    store = TrialStore(db)
    assert store.list_runs() == []
    store.dispose()
