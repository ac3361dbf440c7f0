"""The demo's servers: ``python -m dpicl serve`` subprocesses, each with its own SQLite
database, tokens and log, white-box debug on (``DPICL_WHITEBOX=internal``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx

from dpicl_audit.jsontypes import JsonObject

__all__ = ["DemoServer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DemoServer:
    """A ``python -m dpicl serve`` subprocess with its own database, tokens and log."""

    engine: str
    workdir: Path
    admin_token: str
    api_key: str
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    _log: TextIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.engine}.log"

    def start(self) -> DemoServer:
        env = dict(os.environ) | {
            "DPICL_ENGINE": self.engine,
            "DPICL_WHITEBOX": "internal",
            "DPICL_DATABASE_URL": f"sqlite:///{self.workdir / f'server-{self.engine}.db'}",
            "DPICL_ADMIN_TOKEN": self.admin_token,
            "DPICL_API_KEYS": self.api_key,
            "DPICL_LOG_LEVEL": "warning",
            "DPICL_ALLOW_UNBUDGETED": "true",  # audit contexts are explicitly unbudgeted
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dpicl", "serve", "--port", str(self.port)],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    def wait_ready(self, timeout: float) -> JsonObject:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the {self.engine} server exited early:\n{self._log_tail()}")
            try:
                r = httpx.get(f"{self.url}/healthz", timeout=2.0)
                if r.status_code == 200:
                    return dict(r.json())
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(
            f"the {self.engine} server was not ready in {timeout:.0f}s:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
