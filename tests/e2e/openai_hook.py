"""A context hook as an operator would write one (``dpicl-audit run --api openai
--context-hook "python tests/e2e/openai_hook.py"``): it reads the context the audit asks for
(JSON on stdin), stands it up on the deployment (here: a dpicl server at
``$HOOK_DPICL_URL``, through its admin API, with ``$HOOK_DPICL_ADMIN``), and prints the
deployment's description of it, whose ``id`` is the model to query."""

from __future__ import annotations

import json
import os
import sys

import httpx


def main() -> None:
    body = json.load(sys.stdin)
    r = httpx.post(
        f"{os.environ['HOOK_DPICL_URL']}/v1/contexts",
        json=body,
        headers={"Authorization": f"Bearer {os.environ['HOOK_DPICL_ADMIN']}"},
        timeout=60,
    )
    if r.status_code != 201:
        sys.exit(f"the deployment refused the context: {r.status_code} {r.text[:300]}")
    print(json.dumps(r.json()))


if __name__ == "__main__":
    main()
