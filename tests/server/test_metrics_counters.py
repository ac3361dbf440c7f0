"""Every counter of ``/metrics`` means what its help text says (issue 39), checked after a
scripted sequence of requests through the real app: budget refusals are refusals on every
surface and never database errors; a real database failure is one; the running, waiting,
prefix-cache and device-memory gauges read what they describe."""

from __future__ import annotations

import asyncio
from pathlib import Path

import sqlalchemy as sa
import torch

from dpicl.engines.transformers.batching import MicroBatcher
from dpicl.engines.transformers.prefix_cache import PrefixCache, PrefixEntry
from dpicl.metrics import (
    ENGINE_REQUESTS_RUNNING,
    ENGINE_REQUESTS_WAITING,
    PREFIX_CACHE_ENTRIES,
    PREFIX_CACHE_LIMIT_BYTES,
    PREFIX_CACHE_SIZE_BYTES,
)
from tests.conftest import admin_headers, user_headers
from tests.server.api_helpers import make_client, voting_context
from tests.server.test_keys_processes import budget_for
from tests.server.test_metrics_logs import samples, value


def _family(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples(text).items() if n == name}


def test_counters_after_a_scripted_sequence(tmp_path: Path) -> None:
    with make_client(tmp_path) as c:
        before = c.get("/metrics", headers=admin_headers()).text
        body = voting_context(budget=budget_for(1))
        cid = c.post("/v1/contexts", json=body, headers=admin_headers()).json()["id"]
        ask = {"context_id": cid, "query": "Is it?"}
        chat = {"model": cid, "messages": [{"role": "user", "content": "Is it?"}]}
        missing = "ctx_" + "0" * 24
        expected: dict[tuple[str, str, str], int] = {}
        assert c.post("/v1/classify", json=ask, headers=user_headers()).status_code == 200
        # The budget held one answer: each surface now refuses, natively and OpenAI-style.
        script = [
            ("/v1/classify", lambda: c.post("/v1/classify", json=ask, headers=user_headers())),
            ("/v1/classify", lambda: c.post("/v1/classify", json=ask, headers=user_headers())),
            (
                "/v1/chat/completions",
                lambda: c.post("/v1/chat/completions", json=chat, headers=user_headers()),
            ),
            (
                "/v1/completions",
                lambda: c.post(
                    "/v1/completions",
                    json={"model": cid, "prompt": "Is it?"},
                    headers=user_headers(),
                ),
            ),
            (
                "/v1/models/{model}",
                lambda: c.get(f"/v1/models/{missing}", headers=user_headers()),
            ),
            (
                "/v1/chat/completions",
                lambda: c.post("/v1/chat/completions", json={"model": cid}, headers=user_headers()),
            ),
            (
                "/v1/classify",
                lambda: c.post(
                    "/v1/classify",
                    json={"context_id": missing, "query": "q"},
                    headers=user_headers(),
                ),
            ),
            ("/v1/classify", lambda: c.post("/v1/classify", json={}, headers=user_headers())),
            ("/v1/contexts", lambda: c.get("/v1/contexts")),
        ]
        for route, send in script:
            r = send()
            assert r.status_code >= 400, (route, r.text)
            key = (route, str(r.status_code), r.json()["error"]["code"])
            expected[key] = expected.get(key, 0) + 1
        codes = {k[2] for k in expected}
        assert "budget_exhausted" in codes and {"invalid_request", "unauthorized"} <= codes
        after = c.get("/metrics", headers=admin_headers()).text

        # A real failure of the database: the table a charge writes to is gone.
        db = c.app.state.services.repo.url  # type: ignore[attr-defined]
        other = c.post("/v1/contexts", json=voting_context(), headers=admin_headers()).json()["id"]
        eng = sa.create_engine(db)
        with eng.begin() as conn:
            conn.execute(sa.text("DROP TABLE dpicl_spend"))
        eng.dispose()
        failed = c.post(
            "/v1/classify", json={"context_id": other, "query": "q"}, headers=user_headers()
        )
        assert failed.status_code == 503, failed.text
        broken = c.get("/metrics", headers=admin_headers()).text

    # Budget refusals, 400s, 404s, 422s and 401s: counted by route, status and code, on
    # the native and the OpenAI-compatible routes alike; nothing else was refused.
    refusals = _family(after, "dpicl_refusals_total")
    was = _family(before, "dpicl_refusals_total")
    grown = {
        (dict(k)["route"], dict(k)["status"], dict(k)["code"]): v - was.get(k, 0.0)
        for k, v in refusals.items()
        if v - was.get(k, 0.0)
    }
    assert grown == expected
    # No database failed: no database error, whatever the budgets refused.
    assert _family(after, "dpicl_db_errors_total") == _family(before, "dpicl_db_errors_total")
    # The failure that happened is one, on the charge, and a refusal (503) too.
    errors = value(broken, "dpicl_db_errors_total", operation="charge", kind="error")
    assert errors - value(after, "dpicl_db_errors_total", operation="charge", kind="error") == 1
    # (a difference: the registry is the process's, and earlier tests may have refused too)
    unavailable = {"route": "/v1/classify", "status": "503", "code": "storage_unavailable"}
    assert (
        value(broken, "dpicl_refusals_total", **unavailable)
        - value(after, "dpicl_refusals_total", **unavailable)
        == 1
    )
    # Running: the scrape itself, nothing else; no engine job waits or runs any more.
    assert value(after, "dpicl_requests_running") == 1
    for name in ("dpicl_engine_requests_waiting", "dpicl_engine_requests_running"):
        assert all(v == 0 for v in _family(after, name).values()), name
    # The oracle engine runs in this process: its memory is this process's resident set.
    assert value(after, "dpicl_engine_device_memory_bytes", device="cpu", kind="resident") > 2**20


def test_batcher_gauges_count_waiting_and_running_jobs() -> None:
    """While a batch runs: its jobs running, the later arrivals waiting; then none."""
    seen: list[tuple[float, float]] = []
    release = asyncio.Event()

    def read() -> tuple[float, float]:
        w = ENGINE_REQUESTS_WAITING.labels("gauge-test")._value.get()
        r = ENGINE_REQUESTS_RUNNING.labels("gauge-test")._value.get()
        return w, r

    async def run(jobs: list[int]) -> list[int]:
        seen.append(read())
        await release.wait()
        return jobs

    async def main() -> None:
        batcher: MicroBatcher[int, int] = MicroBatcher(
            run, max_wait_s=0, max_size=2, name="gauge-test"
        )
        tasks = [asyncio.create_task(batcher.submit(i)) for i in range(5)]
        await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(*tasks) == list(range(5))

    asyncio.run(main())
    # The first batch ran alone (nothing else had arrived), then two, two: the jobs behind
    # each batch waited.
    assert seen[0][1] >= 1 and all(r >= 1 for _, r in seen)
    assert any(w >= 2 for w, _ in seen), seen
    assert read() == (0.0, 0.0)


def test_prefix_cache_gauges_follow_its_contents() -> None:
    cache = PrefixCache(max_bytes=6000)

    def entry(n: int) -> PrefixEntry:
        k = torch.zeros(1, 1, n, 25)  # 100 bytes a token for K, as many for V
        return PrefixEntry(ids=tuple(range(n)), layers=((k, k.clone()),))

    assert PREFIX_CACHE_LIMIT_BYTES._value.get() == 6000
    cache.put(("a", "x"), entry(10))
    cache.put(("b", "x"), entry(12))
    assert PREFIX_CACHE_ENTRIES._value.get() == 2
    assert PREFIX_CACHE_SIZE_BYTES._value.get() == cache.nbytes > 0
    cache.put(("c", "x"), entry(20))  # over the budget: the oldest go
    assert PREFIX_CACHE_ENTRIES._value.get() == len(cache) < 3
    assert PREFIX_CACHE_SIZE_BYTES._value.get() == cache.nbytes <= 6000
    cache.clear()
    assert PREFIX_CACHE_ENTRIES._value.get() == 0 == PREFIX_CACHE_SIZE_BYTES._value.get()
