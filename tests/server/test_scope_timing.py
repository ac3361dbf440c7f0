"""A key cannot tell another tenant's context from a missing id by the time of its 404
(issue 39): on ``GET /v1/models/{id}``, ``POST /v1/classify`` and ``POST
/v1/chat/completions``, against a real server process on SQLite and on PostgreSQL, with a
3 MB context that the process has cached (an admin query loaded it).

Each comparison times ``N`` requests for the other tenant's id and ``N`` for one missing id,
interleaved (drift in the machine's load falls on both alike), and asks a two-sided
Mann-Whitney U test whether one tends to take longer. Both arms repeat one id: a repeated id
is answered faster than fresh ones whatever it names (measured on ``GET /v1/models/{id}``, a
fixed missing id against fresh missing ids: 13-15 us of about 1.05 ms, p from 9e-3 to 3e-6
over three runs of 600 pairs), which had the test compare repetition, not scope (it failed
with p = 1e-12 on a quiet machine). With equal distributions its p-value is
uniform: each comparison fails with probability ``ALPHA`` = 1e-4 by chance, the six of this
file (three routes, two back ends) at most 6e-4. A positive control shows that the same
measurement resolves what a 404 used to cost: the admin's read of that context (its rows
loaded) against a missing id, told apart with p < 1e-6 (its answer differs too: it is
only a check that the clock and the sample size are fine enough).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from scipy.stats import mannwhitneyu

from tests.conftest import admin_headers
from tests.server.api_helpers import voting_context

#: Requests of each kind per comparison.
N = 300
#: Each comparison's false-failure rate (see the module docstring).
ALPHA = 1e-4

pytestmark = pytest.mark.slow


def _missing_id() -> str:
    return "ctx_" + secrets.token_hex(12)


def _large_context(tenant: str) -> dict[str, Any]:
    # 3,000 exemplars of ~1,000 characters: 3 MB of private text, as in the issue.
    rows = [
        {"input": f"exemplar {i} " + "lorem ipsum " * 83, "output": "Yes" if i % 2 else "No"}
        for i in range(3000)
    ]
    return voting_context(exemplars=rows, tenant=tenant)


def _times(
    client: httpx.Client, send: Any, hidden: str, n: int = N
) -> tuple[list[float], list[float], set[int]]:
    """``n`` timings of ``send(hidden)`` and of ``send(<one missing id>)``, interleaved (the
    order within each pair alternates), and the statuses seen."""
    a: list[float] = []
    b: list[float] = []
    statuses: set[int] = set()
    missing = _missing_id()
    for i in range(2 * n):
        first_hidden = (i // 2) % 2 == 0
        hide = (i % 2 == 0) == first_hidden
        cid = hidden if hide else missing
        t0 = time.perf_counter()
        r = send(client, cid)
        elapsed = time.perf_counter() - t0
        statuses.add(r.status_code)
        (a if hide else b).append(elapsed)
    return a, b, statuses


def _model(client: httpx.Client, cid: str, key: str) -> httpx.Response:
    return client.get(f"/v1/models/{cid}", headers={"Authorization": f"Bearer {key}"})


def _classify(client: httpx.Client, cid: str, key: str) -> httpx.Response:
    return client.post(
        "/v1/classify",
        json={"context_id": cid, "query": "Is it?"},
        headers={"Authorization": f"Bearer {key}"},
    )


def _chat(client: httpx.Client, cid: str, key: str) -> httpx.Response:
    body = {"model": cid, "messages": [{"role": "user", "content": "Is it?"}]}
    return client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def _check_indistinguishable(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/contexts", json=_large_context("victim"), headers=admin_headers())
        assert r.status_code == 201, r.text
        hidden = r.json()["id"]
        # The admin's query puts it in the process's context cache: the case where a key
        # outside its scope used to get it without a database round trip.
        q = c.post(
            "/v1/classify", json={"context_id": hidden, "query": "x"}, headers=admin_headers()
        )
        assert q.status_code == 200, q.text
        key = c.post("/v1/keys", json={"tenant": "intruder"}, headers=admin_headers())
        assert key.status_code == 201, key.text
        secret = key.json()["secret"]
        # A context of the intruder's own tenant: its lookups find rows too.
        own = c.post(
            "/v1/contexts", json=voting_context(tenant="intruder"), headers=admin_headers()
        )
        assert own.status_code == 201, own.text
        for name, send in [("models", _model), ("classify", _classify), ("chat", _chat)]:

            def call(client: httpx.Client, cid: str, send: Any = send) -> httpx.Response:
                return send(client, cid, secret)

            _times(c, call, hidden, n=20)  # warm-up: connections, statements, code paths
            hid, miss, statuses = _times(c, call, hidden)
            assert statuses == {404}, (name, statuses)
            p = mannwhitneyu(hid, miss, alternative="two-sided").pvalue
            med = (sorted(hid)[N // 2] * 1e3, sorted(miss)[N // 2] * 1e3)
            print(f"{name}: hidden {med[0]:.2f} ms, missing {med[1]:.2f} ms, p={p:.3g}")
            assert p > ALPHA, (
                f"{name}: hidden {med[0]:.2f} ms vs missing {med[1]:.2f} ms, p={p:.2g}"
            )

        # The positive control: the admin's read of the context against a missing id.
        def admin_get(client: httpx.Client, cid: str) -> httpx.Response:
            return client.get(f"/v1/contexts/{cid}", headers=admin_headers())

        hid, miss, statuses = _times(c, admin_get, hidden, n=100)
        assert statuses == {200, 404}
        p = mannwhitneyu(hid, miss, alternative="two-sided").pvalue
        read, miss_ms = sorted(hid)[50] * 1e3, sorted(miss)[50] * 1e3
        print(f"control: 3 MB read {read:.2f} ms, miss {miss_ms:.2f} ms, p={p:.3g}")
        assert p < 1e-6, f"the measurement cannot tell a 3 MB read from a miss (p={p:.2g})"


def _env(url: str) -> dict[str, str]:
    return {
        "DPICL_ENGINE": "oracle",
        "DPICL_DATABASE_URL": url,
        "DPICL_ALLOW_UNBUDGETED": "true",
        "DPICL_LOG_LEVEL": "warning",
    }


def test_out_of_scope_and_missing_ids_take_the_same_time_on_sqlite(
    start_server: Any, tmp_path: Path
) -> None:
    srv = start_server(_env(f"sqlite:///{tmp_path}/timing.db"))
    _check_indistinguishable(srv.url)


@pytest.mark.postgres
def test_out_of_scope_and_missing_ids_take_the_same_time_on_postgres(
    start_server: Any, pg_url: str
) -> None:
    srv = start_server(_env(pg_url))
    _check_indistinguishable(srv.url)
