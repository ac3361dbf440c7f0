"""Shared fixtures: settings for an oracle-backed app, a live server process, PostgreSQL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ADMIN = "test-admin-token"
USER = "test-user-key"
PG_ADMIN_URL = os.environ.get("DPICL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def user_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {USER}"}


class ServerProcess:
    """A real ``dpicl serve`` process on a free port.

    ``command`` runs something else instead (e.g. a patched server script); ``{port}`` in its
    arguments is replaced by the chosen port.
    """

    def __init__(
        self, env: dict[str, str], log_path: Path, command: list[str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        full_env = (
            os.environ
            | {
                "DPICL_ADMIN_TOKEN": ADMIN,
                "DPICL_API_KEYS": USER,
                "DPICL_LOG_LEVEL": "warning",
                # The auditor's canary contexts are explicitly unbudgeted ("budget": null).
                "DPICL_ALLOW_UNBUDGETED": "true",
            }
            | env
        )
        self._log = log_path.open("w")
        argv = (
            [a.replace("{port}", str(self.port)) for a in command]
            if command is not None
            else [sys.executable, "-m", "dpicl", "serve", "--port", str(self.port)]
        )
        self.proc = subprocess.Popen(
            argv,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    servers: list[ServerProcess] = []

    def start(
        env: dict[str, str], *, wait: bool = True, command: list[str] | None = None
    ) -> ServerProcess:
        srv = ServerProcess(env, tmp_path / f"server-{len(servers)}.log", command)
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
