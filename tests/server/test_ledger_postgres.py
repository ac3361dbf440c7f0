"""Atomic charging under concurrency: two real server processes sharing one PostgreSQL
database, 4x more concurrent calls than the budget allows."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import httpx
import pytest

from dpicl.privacy.accounting import gaussian_mu2
from dpicl.privacy.calibration import gaussian_epsilon
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import voting_context

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


async def _fire(urls: list[str], cid: str, n: int) -> Counter[int]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> int:
            r = await client.post(
                f"{urls[i % len(urls)]}/v1/classify",
                json={"context_id": cid, "query": f"query {i}"},
                headers=user_headers(),
            )
            if r.status_code not in (200, 402):
                raise AssertionError(r.text)
            if r.status_code == 402:
                assert r.json()["error"]["code"] == "budget_exhausted"
            return r.status_code

        return Counter(await asyncio.gather(*(one(i) for i in range(n))))


def two_processes_never_overspend(start_server: Any, database_url: str) -> None:
    """Two real server processes on one database, 4x more concurrent calls than the budget
    allows: exactly the budgeted calls succeed, the rest are refused, on both servers."""
    env = {"DPICL_ENGINE": "oracle", "DPICL_DATABASE_URL": database_url}
    a = start_server(env, wait=False)
    b = start_server(env, wait=False)
    a.wait_ready()
    b.wait_ready()
    eps, delta, k = 1.0, 1e-5, 12
    sigma = 2 * math.sqrt(math.log(1.25 / delta)) / eps
    budget_eps = gaussian_epsilon(delta, math.sqrt(k * gaussian_mu2(sigma, math.sqrt(2))))
    r = httpx.post(
        f"{a.url}/v1/contexts",
        json=voting_context(budget={"epsilon": budget_eps, "delta": delta}),
        headers=admin_headers(),
        timeout=30,  # the first context imports dp-accounting; CI machines are loaded
    )
    assert r.status_code == 201, r.text
    cid = r.json()["id"]
    counts = asyncio.run(_fire([a.url, b.url], cid, 4 * k))
    assert counts[200] == k, counts
    assert counts[402] == 3 * k, counts
    for srv in (a, b):
        info = httpx.get(f"{srv.url}/v1/contexts/{cid}", headers=admin_headers()).json()
        assert info["spent"]["queries"] == k
        assert info["spent"]["spent_epsilon"] <= budget_eps * (1 + 1e-9)


def test_two_processes_never_overspend(pg_url: str, start_server: Any) -> None:
    two_processes_never_overspend(start_server, pg_url)
