"""The runner against the real server app (oracle engine) in-process over httpx.ASGITransport:
real-query audits, bootstrap audits, resume after failures, PostgreSQL trial logs.

The auditor package never imports the server; only these tests do, to host it.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpicl_audit.client import DpiclClient
from dpicl_audit.errors import (
    InvalidAuditInput,
    TargetNotFound,
    TargetProtocolError,
    TargetUnavailable,
)
from dpicl_audit.pipeline.estimation import estimate_run
from dpicl_audit.pipeline.run import bootstrap_audit, resume_audit, run_audit
from dpicl_audit.plan import AuditPlan
from dpicl_audit.plan.schedule import CLEAN_SETTING, trial_worlds
from dpicl_audit.store import TrialStore
from tests.conftest import ADMIN, USER
from tests.servers import app_client


def _server_missing() -> str | None:
    try:
        from dpicl.api.app import build_app  # noqa: F401
        from dpicl.config import Settings  # noqa: F401
    except Exception as exc:
        return f"the dpicl server app is not importable yet: {exc}"
    return None


pytestmark = pytest.mark.skipif(_server_missing() is not None, reason=str(_server_missing()))


def oracle_server(
    tmp_path: Path, *, whitebox: str = "internal", concurrency: int = 8
) -> AbstractAsyncContextManager[DpiclClient]:
    """The real app with the oracle simulator, its lifespan run, behind a DpiclClient."""
    db = f"sqlite:///{tmp_path}/server-{whitebox}.db"
    return app_client(db, whitebox=whitebox, concurrency=concurrency)


def _plan(**overrides: Any) -> AuditPlan:
    base: dict[str, Any] = {
        "target.base_url": "http://dpicl.test",
        "target.admin_token": ADMIN,
        "target.api_key": USER,
        "seed": 7,
        "trials": 120,
        "batch_size": 25,
        "mechanism.epsilons": [2.0, 8.0],
        # These tests check paper 000's design (partitions x shots exemplars); the pivotal
        # designs have their own tests (tests/e2e/test_pivotal_oracle.py, test_designs.py).
        "design": "paper",
    }
    return AuditPlan.from_sources(None, base | overrides)


def _check_log(store: TrialStore, run_id: str, plan: AuditPlan) -> None:
    for k, eps in enumerate(plan.mechanism.epsilons):
        rows = store.trials(run_id, plan.setting_key(eps))
        assert [r.trial_index for r in rows] == list(range(plan.trials))
        worlds = trial_worlds(plan.seed, k, plan.trials)
        assert [r.world for r in rows] == [int(w) for w in worlds]


async def test_black_box_run(tmp_path: Path) -> None:
    # T=2: C1's clean votes tie 1-1, so the canary shows in the released label
    plan = _plan(**{"mechanism.partitions": 2, "mechanism.shots": 3})
    db = f"sqlite:///{tmp_path}/audit.db"
    async with oracle_server(tmp_path) as client:
        results = await run_audit(
            plan, db=db, target=client, out_dir=tmp_path / "runs", progress=False, run_id="bb"
        )
        server_ctx = {c["id"]: c for c in await client.list_contexts()}
    store = TrialStore(db)
    _check_log(store, "bb", plan)
    contexts = store.contexts("bb")
    assert len(contexts) == 4
    # the run deleted its contexts from the server (issue 35); the log keeps what it made
    assert not set(server_ctx) & {rec.context_id for rec in contexts.values()}
    for (setting, world), rec in contexts.items():
        info = rec.info
        assert info["name"] == f"dpicl-audit bb {setting} C{world}"
        assert info["mechanism"]["partition_seed"] == results["design"]["partition_seed"]
        assert info["n_exemplars"] == plan.mechanism.n_exemplars
    rows = store.trials("bb", "eps=8")
    assert all(r.observation.keys() == {"label"} for r in rows)
    assert all(r.decision == int(r.observation["label"] == "Yes") for r in rows)
    assert {r.context_id for r in rows if r.world == 1} == {contexts[("eps=8", 1)].context_id}
    run = store.get_run("bb")
    assert run.status == "completed" and run.queries == 240
    assert run.llm_calls == 240 * plan.mechanism.partitions
    assert run.versions["server"]["engine"] == "oracle"
    assert run.versions["auditor"] and run.versions["python"]
    store.dispose()

    assert results["threat_models"] == ["black-box"]
    for s in results["settings"]:
        assert s["white_box"] is None
        bb = s["black_box"]
        assert bb["tp"] + bb["fn"] == s["n_with"] and bb["fp"] + bb["tn"] == s["n_without"]
        assert s["sigma"] > 0 and s["epsilon_exact"] < s["epsilon_theory"]
        assert s["epsilon_exact_server"] == pytest.approx(s["epsilon_exact"], rel=1e-2, abs=1e-3)
        # 120 trials of the paper's design cannot reach half of epsilon_exact: said so. (Or,
        # in a minority of runs of this correct server, the classical figure alone crosses
        # the design's exact epsilon, which the run's family reads INCONCLUSIVE too.)
        assert bb["verdict"]["status"] == "inconclusive", bb["verdict"]
        msg = bb["verdict"]["message"]
        assert "could reach" in msg or "this figure alone reads BUG" in msg, msg
        assert bb["verdict"]["max_reachable"] < 0.5 * s["epsilon_exact"]
    # at epsilon 8 the oracle's canary vote is visible through the noise
    eps8 = results["settings"][1]["black_box"]
    assert eps8["tpr"] > 0.3 > 0.15 > eps8["fpr"]
    saved = json.loads((tmp_path / "runs" / "bb" / "results.json").read_text())
    assert saved["settings"][1]["black_box"]["tp"] == eps8["tp"]


async def test_white_box_run_uses_split_thresholds(tmp_path: Path) -> None:
    """400 trials, so that the white-box bound is positive: at 200 its epsilon_lower was 0 in
    4 of 425 runs (the server's noise is not seeded); at 400 in none of 300 (lowest 1.53,
    mean 3.9, standard deviation 0.96: 0 lies 4 standard deviations below)."""
    plan = _plan(threat_model="white-box", trials=400, **{"mechanism.epsilons": [8.0]})
    async with oracle_server(tmp_path, whitebox="noisy") as client:
        results = await run_audit(
            plan, db=tmp_path / "a.db", target=client, out_dir=tmp_path, progress=False
        )
    s = results["settings"][0]
    wb = s["white_box"]
    held = wb["held_out"]
    assert held["tp"] + held["fn"] < s["n_with"]  # the rest chose the threshold
    assert wb["selection_fraction"] == 0.5  # the default split (docs/auditing.md)
    assert wb["chosen"] in ("black_box", "threshold")
    assert wb["mu_lower"] >= wb["black_box"]["mu_lower"]  # never weaker than black-box
    assert wb["epsilon_lower_classic"] <= s["epsilon_exact"]
    assert "Gaussian" in wb["gdp_label"] and "assumption-free" in wb["classical_label"]
    assert 0 < wb["epsilon_lower"] <= s["epsilon_exact"]
    assert wb["verdict"]["status"] in ("ok", "inconclusive"), wb["verdict"]
    assert results["threat_models"] == ["black-box", "white-box"]
    store = TrialStore(tmp_path / "a.db")
    rows = store.trials(results["run_id"])
    store.dispose()
    assert all(set(r.observation) >= {"label", "noisy_votes", "sigma"} for r in rows)
    for r in rows:
        noisy = r.observation["noisy_votes"]
        assert r.score == pytest.approx(noisy["Yes"] - noisy["No"])
    # the estimate is a pure function of the log
    again = estimate_run(TrialStore(tmp_path / "a.db"), results["run_id"])
    again_wb = again.settings[0].white_box
    assert again_wb is not None and again_wb.epsilon_lower == wb["epsilon_lower"]


@pytest.mark.parametrize("setting", ["audit-template", "deployment"])
async def test_oracle_votes_follow_the_canary(tmp_path: Path, setting: str) -> None:
    """Clean votes: C1 gets exactly one 'present' vote (the canary's partition), C0 none."""
    plan = _plan(
        setting=setting,
        **{"mechanism.epsilons": [1.0], "bootstrap.n_llm": 5, "bootstrap.n_sample": 1000},
    )
    async with oracle_server(tmp_path) as client:
        results = await bootstrap_audit(
            plan, db=tmp_path / "a.db", target=client, out_dir=tmp_path, progress=False
        )
    d = results["design"]
    store = TrialStore(tmp_path / "a.db")
    clean = store.trials(results["run_id"], CLEAN_SETTING)
    store.dispose()
    T = plan.mechanism.partitions
    assert len(clean) == 10 and sum(r.world for r in clean) == 5
    for r in clean:
        votes = r.observation["clean_votes"]
        assert votes[d["positive"]] == r.world
        assert votes[d["negative"]] == T - r.world
        assert sum(votes.values()) == T


async def test_bootstrap_is_tight_on_the_oracle(tmp_path: Path) -> None:
    """Issue 3's criterion: white-box epsilon_emp >= 0.9 epsilon_exact at 1, 2, 4, 8 with
    400,000 simulated trials, and never above epsilon_exact."""
    plan = _plan(**{"mechanism.epsilons": [1.0, 2.0, 4.0, 8.0], "bootstrap.n_llm": 20})
    async with oracle_server(tmp_path) as client:
        results = await bootstrap_audit(
            plan, db=tmp_path / "a.db", target=client, out_dir=tmp_path, progress=False
        )
    assert results["kind"] == "bootstrap"
    for s in results["settings"]:
        wb, bb = s["white_box"], s["black_box"]
        assert s["n_sample"] == 400_000 and s["n_llm"] == 20
        assert wb["epsilon_lower"] >= 0.9 * s["epsilon_exact"], s
        assert wb["verdict"]["status"] == "ok" and bb["verdict"]["status"] == "ok"
        assert bb["epsilon_lower"] <= s["epsilon_exact"]
        assert s["llm_calls"] == 40 * plan.mechanism.partitions


async def test_brainwash_baseline_runs(tmp_path: Path) -> None:
    plan = _plan(
        attack="brainwash", canary="mislabeled", trials=60, **{"mechanism.epsilons": [8.0]}
    )
    async with oracle_server(tmp_path) as client:
        results = await run_audit(
            plan, db=tmp_path / "a.db", target=client, out_dir=tmp_path, progress=False
        )
    d = results["design"]
    assert d["attack"] == "brainwash" and d["negative"] is None
    assert d["labels"] == ["World", "Sports", "Business", "Sci/Tech"]
    assert d["query"].count(d["canary"]) == 7
    assert results["settings"][0]["black_box"]["verdict"]["status"] == "inconclusive"


class FlakyAfter:
    """Wraps a target; classify fails with TargetUnavailable after ``n`` successful calls."""

    def __init__(self, inner: DpiclClient, n: int) -> None:
        self.inner, self.left = inner, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _spend(self) -> None:
        if self.left <= 0:
            raise TargetUnavailable("injected outage")
        self.left -= 1

    async def classify(self, context_id: str, query: str) -> dict[str, Any]:
        self._spend()
        return await self.inner.classify(context_id, query)

    async def debug_classify(self, context_id: str, query: str) -> dict[str, Any]:
        self._spend()
        return await self.inner.debug_classify(context_id, query)


async def test_failed_run_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    plan = _plan(concurrency=4)
    db = tmp_path / "a.db"
    async with oracle_server(tmp_path) as client:
        with pytest.raises(TargetUnavailable, match="injected"):
            await run_audit(
                plan,
                db=db,
                target=FlakyAfter(client, 170),
                run_id="r",
                out_dir=tmp_path,
                progress=False,
            )
        store = TrialStore(db)
        run = store.get_run("r")
        assert run.status == "failed" and "injected" in (run.error or "")
        counts = store.trial_counts("r")
        assert counts["eps=2"] == 120 and 40 <= counts["eps=8"] < 120  # nothing lost at failure
        before = store.contexts("r")
        # a context deleted on the server is re-created identically on resume
        await client.delete_context(before[("eps=8", 0)].context_id)
        results = await resume_audit(
            "r", store=store, target=client, out_dir=tmp_path, progress=False
        )
        after = store.contexts("r")
    assert after[("eps=2", 1)].context_id == before[("eps=2", 1)].context_id
    assert after[("eps=8", 0)].context_id != before[("eps=8", 0)].context_id
    _check_log(store, "r", plan)
    run = store.get_run("r")
    assert run.status == "completed" and run.queries == 240
    assert len(run.versions["resumed"]) == 1
    assert results["settings"][1]["trials"] == 120
    store.dispose()


async def test_orphan_context_is_adopted_on_resume(tmp_path: Path) -> None:
    """A context created just before a crash (not yet recorded) is found by its name."""
    plan = _plan(**{"mechanism.epsilons": [4.0]}, trials=20)
    db = tmp_path / "a.db"
    async with oracle_server(tmp_path) as client:
        # cut off by an outage: the run keeps its contexts for the resume (a finished run
        # deletes them)
        with pytest.raises(TargetUnavailable, match="injected"):
            await run_audit(
                plan, db=db, target=FlakyAfter(client, 10), run_id="o", out_dir=tmp_path,
                progress=False,
            )  # fmt: skip
        store = TrialStore(db)
        rec = store.contexts("o")[("eps=4", 1)]
        # forget it locally, as if the process died between create and record
        from dpicl_audit.store.tables import run_contexts

        with store.engine.begin() as conn:
            conn.execute(run_contexts.delete())
        n_before = len(await client.list_contexts())
        await resume_audit("o", store=store, target=client, out_dir=tmp_path, progress=False)
        assert store.contexts("o")[("eps=4", 1)].context_id == rec.context_id
        # both orphans adopted (none created twice), and deleted once the run finished
        assert len(await client.list_contexts()) == n_before - 2
        store.dispose()


async def test_white_box_needs_the_debug_endpoint(tmp_path: Path) -> None:
    plan = _plan(threat_model="white-box", **{"mechanism.epsilons": [1.0]})
    async with oracle_server(tmp_path, whitebox="off") as client:
        # "404 not_found: Not Found" said nothing of why.
        with pytest.raises(TargetNotFound, match=r"white-box endpoints are off.*DPICL_WHITEBOX"):
            await run_audit(
                plan,
                db=tmp_path / "a.db",
                target=client,
                progress=False,
                out_dir=tmp_path,
                run_id="w",
            )
    store = TrialStore(tmp_path / "a.db")
    assert store.get_run("w").status == "failed"
    store.dispose()
    async with oracle_server(tmp_path, whitebox="noisy") as client:
        with pytest.raises(TargetProtocolError, match="DPICL_WHITEBOX=internal"):
            await bootstrap_audit(
                plan, db=tmp_path / "b.db", target=client, progress=False, out_dir=tmp_path
            )


async def test_many_concurrent_trials(tmp_path: Path) -> None:
    plan = _plan(trials=200, concurrency=32, batch_size=7, **{"mechanism.epsilons": [1.0]})
    async with oracle_server(tmp_path, concurrency=32) as client:
        results = await run_audit(
            plan, db=tmp_path / "a.db", target=client, out_dir=tmp_path, progress=False
        )
    store = TrialStore(tmp_path / "a.db")
    _check_log(store, results["run_id"], plan)
    store.dispose()


@pytest.mark.postgres
async def test_postgres_trial_log(tmp_path: Path, pg_url: str) -> None:
    plan = _plan(threat_model="white-box", trials=60, **{"mechanism.epsilons": [4.0]})
    async with oracle_server(tmp_path) as client:
        with pytest.raises(TargetUnavailable):
            await run_audit(
                plan,
                db=pg_url,
                target=FlakyAfter(client, 0),
                run_id="pg",
                out_dir=tmp_path,
                progress=False,
            )
        results = await resume_audit(
            "pg", db=pg_url, target=client, out_dir=tmp_path, progress=False
        )
    store = TrialStore(pg_url)
    _check_log(store, "pg", plan)
    assert store.get_run("pg").status == "completed"
    store.dispose()
    assert results["settings"][0]["white_box"]["verdict"]["status"] in ("ok", "inconclusive")


def test_schedule_is_deterministic() -> None:
    a = trial_worlds(7, 0, 1000)
    assert np.array_equal(a, trial_worlds(7, 0, 1000))
    assert not np.array_equal(a, trial_worlds(7, 1, 1000))
    assert np.array_equal(trial_worlds(7, 0, 500), a[:500])
    assert 400 < int(a.sum()) < 600


async def test_cancellation_keeps_completed_trials(tmp_path: Path) -> None:
    plan = _plan(trials=250, batch_size=10, **{"mechanism.epsilons": [1.0]})
    db = tmp_path / "a.db"
    async with oracle_server(tmp_path) as client:
        task = asyncio.create_task(
            run_audit(plan, db=db, target=client, run_id="c", out_dir=tmp_path, progress=False)
        )
        store = TrialStore(db)
        for _ in range(400):
            await asyncio.sleep(0.02)
            try:
                if sum(store.trial_counts("c").values()) >= 30:
                    break
            except Exception:
                continue
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store.get_run("c").status == "interrupted"
        done = store.trial_indices("c", "eps=1")
        assert 30 <= len(done) < 250
        await resume_audit("c", store=store, target=client, out_dir=tmp_path, progress=False)
    _check_log(store, "c", plan)
    store.dispose()


@pytest.mark.parametrize("run_id", ["../../escaped", "a/b", "", " x", "r" * 81, "-x"])
async def test_a_run_id_that_cannot_name_a_run_is_refused(tmp_path: Path, run_id: str) -> None:
    # "--run-id ../../escaped" wrote <out>/../../escaped/results.json, outside --out.
    with pytest.raises(InvalidAuditInput, match="run id"):
        await run_audit(
            _plan(),
            db=f"sqlite:///{tmp_path}/a.db",
            run_id=run_id,
            out_dir=tmp_path,
            progress=False,
        )
    assert not (tmp_path / "a.db").exists()  # refused before anything was opened


async def test_a_second_run_with_the_same_id_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/audit.db"
    plan = _plan(trials=10, **{"mechanism.epsilons": [2.0]})
    async with oracle_server(tmp_path) as client:
        await run_audit(
            plan, db=db, target=client, run_id="twice", out_dir=tmp_path, progress=False
        )
        with pytest.raises(InvalidAuditInput, match=r"'twice' already exists.*resume twice"):
            await run_audit(
                plan, db=db, target=client, run_id="twice", out_dir=tmp_path, progress=False
            )


async def test_an_out_that_is_a_file_is_refused_before_the_audit(tmp_path: Path) -> None:
    # It failed with NotADirectoryError only when the finished audit wrote its results.
    from dpicl_audit.report import write_report

    out = tmp_path / "results.txt"
    out.write_text("not a directory")
    db = tmp_path / "a.db"
    with pytest.raises(InvalidAuditInput, match=r"--out .*results\.txt. is a file"):
        await run_audit(_plan(), db=db, run_id="r", out_dir=out, progress=False)
    assert not db.exists()  # refused before anything was opened
    with pytest.raises(InvalidAuditInput, match="cannot be a directory: Not a directory"):
        write_report(["r"], db_url=str(db), out_dir=out / "sub")
