"""/docs and /redoc render in a real browser with every host but the server unreachable:
headless Chromium (Debian's ``chromium``, installed by ``.ci/run`` where apt-get can; the
test skips elsewhere and says why), its host resolver mapping every name except 127.0.0.1
to nothing, so a page that still needed a CDN would render no operation (FastAPI's default
/docs, which loads Swagger UI from cdn.jsdelivr.net, renders none under the same rules:
checked by hand on 2026-11-25)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.servers import oracle_server_env

pytestmark = pytest.mark.slow


def _dom(url: str) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs Debian's package)")
    out = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def test_docs_render_without_internet(start_server: Any, tmp_path: Path) -> None:
    srv = start_server(oracle_server_env(tmp_path, whitebox="off"))
    swagger = _dom(f"{srv.url}/docs")
    paths = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', swagger))
    assert {"/v1/classify", "/v1/models", "/v1/chat/completions", "/v1/completions"} <= paths
    redoc = _dom(f"{srv.url}/redoc")
    assert "/v1/chat/completions" in redoc and "Something went wrong" not in redoc
