"""Shared fixtures: a live server process (``tests.servers``), PostgreSQL.

``ADMIN``, ``USER``, ``ServerProcess`` and ``free_port`` are re-exported from ``tests.servers``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ADMIN, USER, ServerProcess, free_port

__all__ = ["ADMIN", "USER", "ServerProcess", "admin_headers", "free_port", "user_headers"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _share_the_cores() -> None:
    """Set this test process's OpenMP threads before torch loads (this file is imported
    before any test module, so before torch).

    Passive waiting: by default torch's OpenMP threads spin while they wait, taking the
    cores from the server subprocesses, the other xdist worker and the other users of a
    shared machine (issue 30 measured 107-114 s spinning vs 5.5-8 s passive for the same
    generations on 2 loaded cores; ``dpicl serve`` sets the same default). One intra-op
    thread per worker under ``pytest -n N``: N workers at torch's default (every core) would
    run N times as many threads as cores. An explicit OMP_WAIT_POLICY / OMP_NUM_THREADS wins;
    server subprocesses set their own thread count (``dpicl.engines.threads``)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if "PYTEST_XDIST_WORKER" in os.environ:
        # An xdist worker starts with COLUMNS=80 and LINES=24 in its environment, which a
        # serial run does not have; rich fixes a console's width from COLUMNS when the
        # console is made (at import), so a CLI test's own COLUMNS would then be ignored
        # (tests/auditor/test_utility_card.py's 100-column table came out at 80).
        for name, value in (("COLUMNS", "80"), ("LINES", "24")):
            if os.environ.get(name) == value:
                del os.environ[name]
    if workers > 1:
        from dpicl.engines.threads import usable_cores

        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // workers)))


_share_the_cores()

PG_ADMIN_URL = os.environ.get("DPICL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def user_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {USER}"}


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    servers: list[ServerProcess] = []

    def start(
        env: dict[str, str],
        *,
        wait: bool = True,
        command: list[str] | None = None,
        fault: str | None = None,
    ) -> ServerProcess:
        """A real server (``tests.servers.ServerProcess``), stopped after the test."""
        srv = ServerProcess(env, tmp_path / f"server-{len(servers)}.log", command, fault=fault)
        servers.append(srv)
        if wait:
            srv.wait_ready()
        return srv

    yield start
    for s in servers:
        s.stop()


def _pg_available() -> str | None:
    try:
        import sqlalchemy as sa

        eng = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(sa.text("select 1"))
        eng.dispose()
        return None
    except Exception as exc:
        return f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    reason = _pg_available()
    if reason:
        pytest.skip(reason)
    import sqlalchemy as sa

    name = f"dpicl_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
