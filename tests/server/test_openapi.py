"""openapi/openapi.json is generated from the app; this fails when they drift."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_openapi_document_is_current() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dpicl", "openapi"], capture_output=True, text=True, check=True
    ).stdout
    committed = (ROOT / "openapi" / "openapi.json").read_text()
    assert json.loads(out) == json.loads(committed), (
        "openapi/openapi.json is stale: run `make openapi` and commit the result"
    )


def test_every_route_documents_the_error_shape() -> None:
    spec = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    assert "ErrorResponse" in spec["components"]["schemas"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if path in ("/healthz", "/livez", "/readyz"):  # public, no token
                continue
            assert "401" in op["responses"], (method, path)
            assert len(op["summary"].splitlines()) == 1
