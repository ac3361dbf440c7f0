"""The SQL trial log on SQLite and PostgreSQL: runs, contexts, batched idempotent trials."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from dpicl_audit.errors import InvalidAuditInput, RunNotFound
from dpicl_audit.store import DEFAULT_DB, TrialRecord, TrialStore, resolve_db_url


def _trial(i: int, setting: str = "eps=1", world: int | None = None) -> TrialRecord:
    w = i % 2 if world is None else world
    return TrialRecord(
        setting=setting,
        trial_index=i,
        world=w,
        context_id=f"ctx_{w}",
        query="is it present?",
        observation={"label": "Yes" if w else "No", "noisy_votes": {"Yes": 1.5, "No": -0.5}},
        decision=w,
        latency_s=0.01,
        epsilon=1.0,
        score=2.0 if w else -1.0,
    )


def exercise(store: TrialStore) -> None:
    store.create_run(
        "r1",
        plan={"trials": 10},
        versions={"auditor": "0.1.0"},
        design={"query": "q"},
        name="first",
    )
    with pytest.raises(InvalidAuditInput, match="already exists"):
        store.create_run("r1", plan={}, versions={})
    run = store.get_run("r1")
    assert run.status == "running" and run.plan == {"trials": 10} and run.kind == "run"
    assert run.design == {"query": "q"} and run.name == "first"

    # contexts: one per (setting, world), replaceable
    store.save_context("r1", setting="eps=1", world=1, epsilon=1.0, context_id="a", info={"s": 1})
    store.save_context("r1", setting="eps=1", world=0, epsilon=1.0, context_id="b", info={})
    store.save_context("r1", setting="eps=1", world=1, epsilon=1.0, context_id="c", info={"s": 2})
    ctx = store.contexts("r1")
    assert ctx[("eps=1", 1)].context_id == "c" and ctx[("eps=1", 1)].info == {"s": 2}
    assert ctx[("eps=1", 0)].context_id == "b" and len(ctx) == 2

    # batched, idempotent inserts
    assert store.add_trials("r1", [_trial(i) for i in range(5)], llm_calls_per_trial=4) == 5
    again = [_trial(i) for i in range(3, 8)] + [_trial(7)]  # overlaps and an in-batch duplicate
    assert store.add_trials("r1", again, wall_time_s=1.5, llm_calls_per_trial=4) == 3
    assert store.add_trials("r1", [_trial(0, setting="eps=2")]) == 1
    assert store.trial_indices("r1", "eps=1") == set(range(8))
    assert store.trial_counts("r1") == {"eps=1": 8, "eps=2": 1}
    rows = store.trials("r1", "eps=1")
    assert [r.trial_index for r in rows] == list(range(8))
    assert rows[1].observation["noisy_votes"] == {"Yes": 1.5, "No": -0.5}
    assert rows[1].score == 2.0 and rows[1].decision == 1 and rows[0].world == 0
    assert len(store.trials("r1")) == 9
    run = store.get_run("r1")
    assert run.llm_calls == 8 * 4 and run.queries == 9
    assert run.wall_time_s == pytest.approx(1.5)

    # the UNIQUE constraint itself holds even without the pre-check
    from dpicl_audit.store.log import _trial_row
    from dpicl_audit.store.tables import trials

    with store.engine.begin() as conn:
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(sa.insert(trials), [_trial_row("r1", _trial(0))])
        conn.rollback()

    store.update_run("r1", status="completed", results={"ok": True})
    assert store.get_run("r1").results == {"ok": True}
    with pytest.raises(InvalidAuditInput):
        store.update_run("r1", plan={})
    with pytest.raises(RunNotFound):
        store.update_run("nope", status="x")
    with pytest.raises(RunNotFound, match="no run 'nope'"):
        store.get_run("nope")
    store.create_run("r2", plan={}, versions={}, kind="bootstrap")
    assert [r.id for r in store.list_runs()] == ["r1", "r2"]
    assert store.add_trials("r2", [], wall_time_s=2.0) == 0
    assert store.get_run("r2").wall_time_s == pytest.approx(2.0)


def test_sqlite_file(tmp_path: Path) -> None:
    store = TrialStore(tmp_path / "sub" / "audit.db")  # a bare path is a SQLite file
    assert store.url.startswith("sqlite:///")
    exercise(store)
    store.dispose()
    # reopening sees everything
    again = TrialStore(f"sqlite:///{tmp_path}/sub/audit.db")
    assert again.trial_counts("r1") == {"eps=1": 8, "eps=2": 1}
    again.dispose()


def test_resolve_db_url() -> None:
    assert resolve_db_url(None) == DEFAULT_DB
    assert resolve_db_url("x.db") == "sqlite:///x.db"
    assert resolve_db_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    with pytest.raises(InvalidAuditInput):
        resolve_db_url("://nowhere")
    with pytest.raises(InvalidAuditInput, match="PostgreSQL"):
        TrialStore("sqlite://", schema="x")


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[tuple[str, str]]:
    """A unique schema inside the per-test PostgreSQL database."""
    schema = f"audit_{uuid.uuid4().hex[:10]}"
    eng = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    yield pg_url, schema
    with eng.connect() as c:
        c.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    eng.dispose()


@pytest.mark.postgres
def test_postgresql(pg_url: str) -> None:
    store = TrialStore(pg_url)
    exercise(store)
    store.dispose()


@pytest.mark.postgres
def test_postgresql_schema(pg_schema: tuple[str, str]) -> None:
    url, schema = pg_schema
    store = TrialStore(url, schema=schema)
    exercise(store)
    store.dispose()
    eng = sa.create_engine(url)
    with eng.connect() as c:
        n = c.execute(sa.text(f'SELECT count(*) FROM "{schema}".trials')).scalar_one()
        public = c.execute(
            sa.text(
                "SELECT count(*) FROM information_schema.tables WHERE table_name='trials' "
                "AND table_schema='public'"
            )
        ).scalar_one()
    eng.dispose()
    assert n == 9 and public == 0


def test_a_db_that_cannot_hold_a_trial_log_is_named(tmp_path: Path) -> None:
    # Each was a SQLAlchemy traceback from `dpicl-audit list --db ...`.
    with pytest.raises(InvalidAuditInput, match="is a directory; give a SQLite file in it"):
        TrialStore(tmp_path)
    not_a_db = tmp_path / "notes.txt"
    not_a_db.write_bytes(b"these are not the pages of a database" * 100)
    with pytest.raises(InvalidAuditInput, match=r"notes\.txt.*file is not a database"):
        TrialStore(not_a_db)
    # A server that does not answer, its password hidden.
    with pytest.raises(InvalidAuditInput, match=r"u:\*\*\*@127\.0\.0\.1:1/x.*OperationalError"):
        TrialStore("postgresql+psycopg://u:hunter2@127.0.0.1:1/x")
