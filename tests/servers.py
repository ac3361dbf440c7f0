"""Real dpicl servers for tests: a free port, readiness on ``/healthz``, a server process
(honest, or with one deliberate fault patched in), a server thread, and the app in this
process behind the auditor's client (``httpx.ASGITransport``, lifespan run).

A positive control is a module that defines a fault, ``install()`` (patch it into the server's
modules in this process) and ``WARNING`` (what the server logs at start), e.g.
``tests/e2e/broken_voting_server.py``; ``module:ATTR`` names such an object inside a module
holding several (``tests/e2e/broken_esa_server.py``). A test starts the real app with it by
naming the module:

    srv = start_server(env, fault="tests.e2e.broken_voting_server")

and by hand, from the repository root (settings from ``DPICL_*`` as usual):

    python -m tests.servers tests.e2e.broken_voting_server PORT
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from dpicl_audit.errors import TargetUnavailable
from dpicl_audit.plan import AuditPlan

if TYPE_CHECKING:
    from dpicl.config import Settings
    from dpicl_audit.client import DpiclClient

__all__ = [
    "ADMIN",
    "ROOT",
    "USER",
    "ServerProcess",
    "ThreadServer",
    "app_client",
    "free_port",
    "oracle_server_env",
    "serve_with_fault",
    "server_settings",
    "target_plan",
    "wait_healthy",
]

ADMIN = "test-admin-token"
USER = "test-user-key"
ROOT = Path(__file__).resolve().parent.parent
"""The repository root: ``python -m tests.servers`` runs there, so ``tests`` is importable."""


def oracle_server_env(tmp_path: Path, whitebox: str = "internal") -> dict[str, str]:
    """The environment of an oracle-engine test server with its own SQLite file."""
    return {
        "DPICL_ENGINE": "oracle",
        "DPICL_WHITEBOX": whitebox,
        "DPICL_DATABASE_URL": f"sqlite:///{tmp_path}/server-{whitebox}.db",
    }


def target_plan(url: str, **flags: Any) -> AuditPlan:
    """An audit plan against the test server at ``url`` (the test tokens), CLI-style flags."""
    return AuditPlan.from_sources(
        None, {"target.base_url": url, "target.admin_token": ADMIN, "target.api_key": USER} | flags
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(
    url: str, timeout: float, *, died: Callable[[], str | None] = lambda: None
) -> None:
    """Poll ``url/healthz`` until it answers 200. ``died`` returns why the server can no longer
    answer (it exited, with its log) or ``None`` while it may still come up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reason = died()
        if reason is not None:
            raise RuntimeError(reason)
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server at {url} not ready in {timeout}s")


def server_settings(
    database_url: str,
    *,
    engine: str = "oracle",
    whitebox: str = "internal",
    allow_unbudgeted: bool = True,
    **extra: Any,
) -> Settings:
    """Settings of a test server: this module's tokens, unbudgeted contexts allowed unless
    ``allow_unbudgeted=False`` (a production configuration)."""
    from dpicl.config import Settings

    return Settings(
        engine=engine,  # type: ignore[arg-type]
        whitebox=whitebox,  # type: ignore[arg-type]
        database_url=database_url,
        admin_token=ADMIN,
        api_keys=[USER],
        allow_unbudgeted=allow_unbudgeted,
        **extra,
    )


@asynccontextmanager
async def app_client(
    database_url: str,
    *,
    engine: str = "oracle",
    whitebox: str = "internal",
    concurrency: int = 8,
    request_timeout: float = 60.0,
    allow_unbudgeted: bool = True,
    **extra: Any,
) -> AsyncIterator[DpiclClient]:
    """The real app in this process, its lifespan run, behind a DpiclClient whose requests
    time out after ``request_timeout`` seconds (``allow_unbudgeted=False``: as deployed;
    ``extra``: further settings, e.g. ``max_budget_epsilon``)."""
    from dpicl.api.app import build_app
    from dpicl_audit.client import DpiclClient

    settings = server_settings(
        database_url, engine=engine, whitebox=whitebox, allow_unbudgeted=allow_unbudgeted, **extra
    )
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        client = DpiclClient(
            "http://dpicl.test",
            admin_token=ADMIN,
            api_key=USER,
            concurrency=concurrency,
            retries=1,
            backoff=0.01,
            transport=httpx.ASGITransport(app=app),
            timeout=request_timeout,
        )
        try:
            yield client
        finally:
            await client.aclose()


class FailsAfter:
    """Wraps an audit target: its ``method`` raises TargetUnavailable once it has answered
    ``n`` calls (an outage mid-run, for resume tests); ``calls`` counts every call."""

    def __init__(self, inner: Any, n: int, method: str) -> None:
        self.inner, self.left, self.calls, self.method = inner, n, 0, method

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name != self.method:
            return found

        async def failing(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            if self.left <= 0:
                raise TargetUnavailable("injected outage")
            self.left -= 1
            return await found(*args, **kw)

        return failing


class ServerProcess:
    """A real ``dpicl serve`` process on a free port.

    ``fault`` names a positive-control module (module doc) to patch in; ``command`` runs
    something else instead (``{port}`` in its arguments is replaced by the chosen port).
    """

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        command: list[str] | None = None,
        *,
        fault: str | None = None,
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
        if command is not None:
            argv = [a.replace("{port}", str(self.port)) for a in command]
        elif fault is not None:
            argv = [sys.executable, "-m", "tests.servers", fault, str(self.port)]
        else:
            argv = [sys.executable, "-m", "dpicl", "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            argv,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT if fault is not None else None,
        )

    def _died(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"server exited early:\n{self.log_path.read_text()}"

    def wait_ready(self, timeout: float = 240.0) -> None:
        try:
            wait_healthy(self.url, timeout, died=self._died)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}:\n{self.log_path.read_text()}") from None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


class ThreadServer:
    """The real server app (oracle engine) under uvicorn on ``port`` (default: a free one), in
    a thread of this process, with ``dpicl serve``'s HTTP limits (``overrides``: settings);
    a context manager that waits for ``/healthz`` on entry."""

    def __init__(
        self,
        db_path: Path,
        whitebox: str = "internal",
        port: int | None = None,
        **overrides: Any,
    ) -> None:
        import uvicorn

        from dpicl.api.app import build_app
        from dpicl.api.http_limits import uvicorn_options

        settings = server_settings(
            f"sqlite:///{db_path}", whitebox=whitebox, log_level="warning", **overrides
        )
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            build_app(settings),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            **uvicorn_options(settings),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_healthy(self.url, 60.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def serve_with_fault(fault: str, port: int) -> None:
    """Serve the real app on ``port`` with the positive control ``fault`` patched in."""
    import importlib
    import logging

    import uvicorn

    from dpicl.api.app import build_app
    from dpicl.api.http_limits import uvicorn_options
    from dpicl.config import Settings

    # "package.module" or "package.module:ATTR" (one module holding several faults).
    module, _, attr = fault.partition(":")
    control: Any = importlib.import_module(module)
    if attr:
        control = getattr(control, attr)
    control.install()
    settings = Settings().model_copy(update={"host": "127.0.0.1", "port": port})
    logging.basicConfig(level=settings.log_level.upper())
    logging.getLogger("dpicl").warning("POSITIVE CONTROL: %s", control.WARNING)
    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=port,
        log_level=settings.log_level,
        access_log=False,
        **uvicorn_options(settings),
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m tests.servers FAULT_MODULE PORT")
    serve_with_fault(sys.argv[1], int(sys.argv[2]))
