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
