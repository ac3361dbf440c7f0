"""Keys and tenants as a deployer meets them (issue 25): two real server processes on one
database (PostgreSQL; the overload part on SQLite too), the oracle engine, over HTTP.

- each key reaches only its own contexts; outside its scope a context is a plain 404;
- a key revoked through one process is refused by the other at once;
- under 4x overload, neither the key's budget nor the context's is overspent, and a rate
  limit admits exactly its number of answers per window, across both processes;
- the ledgers' totals equal the sums of the spend rows.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from dpicl.privacy.accounting import gaussian_mu2
from dpicl.privacy.calibration import gaussian_epsilon
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import voting_context

pytestmark = [pytest.mark.slow]

EPS, DELTA = 1.0, 1e-5
SIGMA = 2 * math.sqrt(math.log(1.25 / DELTA)) / EPS
MU2 = gaussian_mu2(SIGMA, math.sqrt(2))


def budget_for(k: int) -> dict[str, float]:
    """A budget that holds exactly k voting answers of the test contexts."""
    return {"epsilon": gaussian_epsilon(DELTA, math.sqrt(k * MU2)), "delta": DELTA}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def two_servers(start_server: Any, url: str) -> tuple[Any, Any]:
    env = {"DPICL_ENGINE": "oracle", "DPICL_DATABASE_URL": url}
    a = start_server(env, wait=False)
    b = start_server(env, wait=False)
    a.wait_ready()
    b.wait_ready()
    return a, b


def new_context(url: str, **fields: Any) -> str:
    r = httpx.post(
        f"{url}/v1/contexts", json=voting_context(**fields), headers=admin_headers(), timeout=60
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def new_key(url: str, **spec: Any) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/keys", json=spec, headers=admin_headers(), timeout=30)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def _fire(
    urls: list[str], cid: str, headers: dict[str, str], n: int
) -> tuple[Counter[int], list[httpx.Response]]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> httpx.Response:
            return await client.post(
                f"{urls[i % len(urls)]}/v1/classify",
                json={"context_id": cid, "query": f"query {i}"},
                headers=headers,
            )

        got = await asyncio.gather(*(one(i) for i in range(n)))
    return Counter(r.status_code for r in got), list(got)


def fire(urls: list[str], cid: str, headers: dict[str, str], n: int) -> Counter[int]:
    counts, got = asyncio.run(_fire(urls, cid, headers, n))
    for r in got:
        if r.status_code == 402:
            assert r.json()["error"]["code"] == "budget_exhausted", r.text
        elif r.status_code != 200:
            raise AssertionError(r.text)
    return counts


def spend_adds_up(db_url: str) -> None:
    """Every ledger's totals equal the sums of its spend rows (answered ones)."""
    eng = sa.create_engine(db_url)
    with eng.connect() as c:
        ctx = c.execute(sa.text("SELECT id, mu2_spent, queries FROM dpicl_contexts")).all()
        keys = c.execute(sa.text("SELECT id, mu2_spent, queries FROM dpicl_keys")).all()
        by_ctx = dict(
            (r[0], (float(r[1]), int(r[2])))
            for r in c.execute(
                sa.text(
                    "SELECT context_id, SUM(mu2), COUNT(*) FROM dpicl_spend "
                    "WHERE outcome = 'answered' GROUP BY context_id"
                )
            )
        )
        by_key = dict(
            (r[0], (float(r[1]), int(r[2])))
            for r in c.execute(
                sa.text(
                    "SELECT key_id, SUM(mu2), COUNT(*) FROM dpicl_spend "
                    "WHERE outcome = 'answered' GROUP BY key_id"
                )
            )
        )
    eng.dispose()
    for cid, mu2, queries in ctx:
        got_mu2, got_n = by_ctx.get(cid, (0.0, 0))
        assert got_n == queries, (cid, got_n, queries)
        assert math.isclose(got_mu2, mu2, rel_tol=1e-9, abs_tol=1e-12), (cid, got_mu2, mu2)
    for kid, mu2, queries in keys:
        got_mu2, got_n = by_key.get(kid, (0.0, 0))
        assert got_n == queries, (kid, got_n, queries)
        assert math.isclose(got_mu2, mu2, rel_tol=1e-9, abs_tol=1e-12), (kid, got_mu2, mu2)


def key_budget_holds_under_overload(a: Any, b: Any, db_url: str) -> None:
    """A key budgeted for k answers on a context budgeted for 2k, then the static key:
    4x overload each time, across both processes. Exactly k answers to the key (its budget),
    exactly k more to the static key (the context's), never one more."""
    k = 6
    cid = new_context(a.url, budget=budget_for(2 * k), tenant="acme")
    key = new_key(a.url, name="budgeted", tenant="acme", budget=budget_for(k))
    counts = fire([a.url, b.url], cid, bearer(key["secret"]), 4 * k)
    assert counts == Counter({200: k, 402: 3 * k}), counts
    counts = fire([b.url, a.url], cid, user_headers(), 4 * k)
    assert counts == Counter({200: k, 402: 3 * k}), counts
    info = httpx.get(f"{a.url}/v1/contexts/{cid}", headers=admin_headers()).json()
    assert info["spent"]["queries"] == 2 * k
    assert info["spent"]["spent_epsilon"] <= budget_for(2 * k)["epsilon"] * (1 + 1e-9)
    listed = httpx.get(f"{b.url}/v1/keys", headers=admin_headers()).json()["data"]
    mine = next(x for x in listed if x["id"] == key["id"])
    assert mine["spent"]["queries"] == k
    assert mine["spent"]["spent_epsilon"] <= budget_for(k)["epsilon"] * (1 + 1e-9)
    assert "secret" not in mine
    spend = httpx.get(f"{b.url}/v1/contexts/{cid}/spend", headers=admin_headers()).json()
    by_key = {t["key_id"]: t for t in spend["by_key"]}
    assert by_key[key["id"]]["answered"] == k
    assert by_key[key["id"]]["refused"] == 3 * k
    static = next(t for t in spend["by_key"] if t["key_id"].startswith("static-"))
    assert static["answered"] == k
    assert sum(t["answered"] for t in spend["by_key"]) == spend["queries"] == 2 * k
    assert math.isclose(
        by_key[key["id"]]["spent_epsilon"], mine["spent"]["spent_epsilon"], rel_tol=1e-9
    )
    spend_adds_up(db_url)


@pytest.mark.postgres
def test_tenants_keys_and_limits_across_two_processes_on_postgres(
    pg_url: str, start_server: Any
) -> None:
    a, b = two_servers(start_server, pg_url)
    acme = new_context(a.url, tenant="acme", budget=None)
    globex = new_context(a.url, tenant="globex", budget=None)
    loose = new_context(a.url, budget=None)  # no tenant: only unscoped keys reach it
    k_acme = new_key(a.url, name="acme", tenant="acme")
    k_list = new_key(b.url, name="one context", contexts=[globex])
    assert k_acme["secret"].startswith("dpk_") and k_acme["id"].startswith("key_")

    # Scopes, through the other process than the one that made the key.
    def ask(srv: Any, cid: str, secret: str) -> httpx.Response:
        return httpx.post(
            f"{srv.url}/v1/classify",
            json={"context_id": cid, "query": "q"},
            headers=bearer(secret),
            timeout=30,
        )

    assert ask(b, acme, k_acme["secret"]).status_code == 200
    assert ask(a, globex, k_list["secret"]).status_code == 200
    missing = "ctx_" + "f" * 24
    for srv, cid, secret in [
        (b, globex, k_acme["secret"]),
        (b, loose, k_acme["secret"]),
        (a, acme, k_list["secret"]),
    ]:
        outside, absent = ask(srv, cid, secret), ask(srv, missing, secret)
        assert outside.status_code == absent.status_code == 404
        # The same answer as for an id that does not exist, the id aside.
        assert outside.json() == {
            "error": {**absent.json()["error"], "message": f"no context with id {cid!r}"}
        }
        assert absent.json()["error"]["message"] == f"no context with id {missing!r}"

    def listed(srv: Any, headers: dict[str, str]) -> set[str]:
        r = httpx.get(f"{srv.url}/v1/contexts", headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        return {c["id"] for c in r.json()["data"]}

    assert listed(b, bearer(k_acme["secret"])) == {acme}
    assert listed(a, bearer(k_list["secret"])) == {globex}
    assert listed(a, admin_headers()) == listed(b, user_headers()) == {acme, globex, loose}

    # Revocation through A holds at once on B (no restart, no cache).
    r = httpx.delete(f"{a.url}/v1/keys/{k_acme['id']}", headers=admin_headers())
    assert r.status_code == 204, r.text
    for srv in (b, a):
        refused = ask(srv, acme, k_acme["secret"])
        assert refused.status_code == 401, refused.text
        r = httpx.get(f"{srv.url}/v1/contexts", headers=bearer(k_acme["secret"]))
        assert r.status_code == 401
    assert ask(b, globex, k_list["secret"]).status_code == 200  # the other key still works
    live = httpx.get(f"{b.url}/v1/keys", headers=admin_headers()).json()["data"]
    assert [k["id"] for k in live] == [k_list["id"]]

    # A rate limit of 10 in any 60 s under 4x overload across both processes: exactly 10
    # answers, the rest 429 with Retry-After (a sliding window: where a minute ends does not
    # matter, issue 47).
    limited = new_key(a.url, name="limited", tenant="acme", rate_limit=10)
    counts, got = asyncio.run(_fire([a.url, b.url], acme, bearer(limited["secret"]), 40))
    assert counts == Counter({200: 10, 429: 30}), counts
    for r in got:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limited"
            assert 1 <= int(r.headers["Retry-After"]) <= 60

    key_budget_holds_under_overload(a, b, pg_url)


def test_key_budget_holds_across_two_processes_on_sqlite(tmp_path: Any, start_server: Any) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    a, b = two_servers(start_server, url)
    key_budget_holds_under_overload(a, b, url)
