"""Alembic migrations: several processes starting at once on a fresh database (SQLite and
PostgreSQL) all succeed, and a database built by the old ``create_all`` is adopted intact."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from dpicl.store.migrations import head, upgrade
from dpicl.store.models import Base
from dpicl.store.repository import make_engine

# Each process builds the server's repository and migrates, as the app's lifespan does.
_START = textwrap.dedent(
    """
    import sys, time
    from dpicl.store.repository import ContextRepository
    t = float(sys.argv[2])
    while time.time() < t:  # start together
        time.sleep(0.001)
    repo = ContextRepository(sys.argv[1], timeout_s=30)
    repo.migrate()
    repo.dispose()
    """
)


def _start_many(url: str, n: int) -> None:
    import time

    at = str(time.time() + 2.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _START, url, at],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(n)
    ]
    outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    failed = [(p.returncode, o) for p, o in zip(procs, outs, strict=True) if p.returncode]
    assert not failed, failed


def _revision(url: str) -> str | None:
    eng = sa.create_engine(url)
    with eng.connect() as c:
        rows = c.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    eng.dispose()
    assert len(rows) == 1, rows
    return str(rows[0][0])


@pytest.mark.slow
def test_concurrent_start_on_a_fresh_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    _start_many(url, 6)
    assert _revision(url) == head()


@pytest.mark.slow
@pytest.mark.postgres
def test_concurrent_start_on_a_fresh_postgres_database(pg_url: str) -> None:
    _start_many(pg_url, 6)
    assert _revision(pg_url) == head()


def _at_revision(eng: sa.Engine, revision: str) -> None:
    """Build the schema of ``revision`` (the models now describe the head's)."""
    from alembic import command

    from dpicl.store.migrations import _config

    with eng.connect() as conn:
        command.upgrade(_config(conn), revision)
        conn.commit()


def test_create_all_database_is_adopted_without_data_loss(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    eng = make_engine(url)
    # How the schema was built before the migrations: create_all of the models of that time,
    # the schema of revision 0001, with no alembic_version table.
    _at_revision(eng, "0001")
    with eng.begin() as c:
        c.execute(sa.text("DROP TABLE alembic_version"))
    row = {
        "id": "ctx_" + "a" * 24,
        "name": "old",
        "task": "classification",
        "labels": '["Yes", "No"]',
        "exemplars": '[{"input": "x", "output": "Yes"}]',
        "template": "{exemplars}{query}",
        "mechanism": '{"name": "voting"}',
        "budget": None,
        "mu2_spent": 0.25,
        "mu2_max": None,
        "queries": 3,
        "max_queries": None,
        "created_at": "2026-01-01 00:00:00",
    }
    with eng.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO dpicl_contexts VALUES (:id, :name, :task, :labels, :exemplars, "
                ":template, :mechanism, :budget, :mu2_spent, :mu2_max, :queries, :max_queries, "
                ":created_at)"
            ),
            row,
        )
    upgrade(eng)
    upgrade(eng)  # idempotent
    with eng.connect() as c:
        got = c.execute(sa.text("SELECT id, mu2_spent, queries FROM dpicl_contexts")).all()
        version = c.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    eng.dispose()
    assert [tuple(r) for r in got] == [(row["id"], 0.25, 3)]
    assert version == head()


def test_migrated_schema_equals_the_models(tmp_path: Path) -> None:
    """The migrations build exactly the tables and columns the ORM models declare."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    eng = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(eng)
    with eng.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    eng.dispose()
    assert diff == []
