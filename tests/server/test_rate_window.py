"""A key's rate limit holds in every 60 s window (issue 47: it was a fixed window on the clock
minute, which let up to twice the limit through around a minute's end), with a truthful
Retry-After, tested at the exact boundaries with an injected clock, on both back ends."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from dpicl.store.charges import Charged, Refused
from dpicl.store.keys import INTERNAL, Principal, revoke_key
from dpicl.store.models import RateEventRow
from dpicl.store.repository import ContextRepository
from tests.server.test_group_commit import _context, _key

T0 = 1_800_000_000.0  # a whole minute since the epoch: the old window's boundary


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'rate.db'}"
    else:
        yield request.getfixturevalue("pg_url")


def _setup(url: str, limit: int) -> tuple[ContextRepository, Clock, str, Principal]:
    clock = Clock()
    repo = ContextRepository(url, rate_clock=clock)
    repo.migrate()

    async def make() -> tuple[str, Principal]:
        return await _context(repo, mu2_max=None), await _key(repo, rate_limit=limit)

    cid, key = asyncio.run(make())
    return repo, clock, cid, key


def _ask(repo: ContextRepository, cid: str, key: Principal, at: float, clock: Clock) -> Any:
    clock.now = at
    return asyncio.run(repo.charge(repo.charge_request(cid, key, 1.0, 0.1, 0.0)))


@pytest.mark.postgres
def test_the_limit_holds_across_the_minute_boundary_and_retry_after_is_exact(url: str) -> None:
    repo, clock, cid, key = _setup(url, limit=3)
    try:
        # A burst of 3 just before the clock minute ends...
        for dt in (-0.5, -0.4, -0.3):
            assert isinstance(_ask(repo, cid, key, T0 + dt, clock), Charged)
        # ...and none just after it (the fixed window admitted 3 more here).
        out = _ask(repo, cid, key, T0 + 0.5, clock)
        assert isinstance(out, Refused) and out.reason == "rate"
        # The oldest leaves the window at T0 - 0.5 + 60 = T0 + 59.5: Retry-After 59 s.
        assert out.retry_after_s == 59
        refused = _ask(repo, cid, key, T0 + 59.499999, clock)
        assert isinstance(refused, Refused) and refused.retry_after_s == 1
        assert isinstance(_ask(repo, cid, key, T0 + 59.5, clock), Charged)  # exactly then
        again = _ask(repo, cid, key, T0 + 59.5, clock)
        assert isinstance(again, Refused) and again.retry_after_s == 1  # next: T0 + 59.6
        assert isinstance(_ask(repo, cid, key, T0 + 59.6, clock), Charged)
        # Waiting Retry-After is enough, every time.
        out = _ask(repo, cid, key, T0 + 59.6, clock)
        assert isinstance(out, Refused) and out.retry_after_s == 1
        assert isinstance(_ask(repo, cid, key, T0 + 59.6 + out.retry_after_s, clock), Charged)
        # The context's ledger counted only the answers (refusals roll back).
        ctx = asyncio.run(repo.get(cid))
        assert ctx is not None and ctx.queries == 6
    finally:
        repo.dispose()


def _rate_rows(repo: ContextRepository) -> int:
    with repo.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(RateEventRow)).scalar_one())


@pytest.mark.postgres
def test_the_rate_log_stays_bounded_as_keys_come_and_go(url: str) -> None:
    """The log holds at most ``rate_limit`` entries per live key, however many keys were
    used and revoked: a revoked key is never charged again, so its entries went only with
    it (the soak, issue 47, found them left behind: 2 rows per key, for ever)."""
    limit = 2
    repo, clock, cid, live = _setup(url, limit=limit)
    try:
        for i in range(25):
            key = asyncio.run(_key(repo, rate_limit=limit))
            outs = [_ask(repo, cid, key, T0 + 30 * i + j / 1000, clock) for j in range(limit + 1)]
            assert [type(o) for o in outs] == [Charged] * limit + [Refused]
            kid = key.key_id
            assert asyncio.run(repo.run(lambda conn, kid=kid: revoke_key(conn, kid), write=True))
            _ask(repo, cid, live, T0 + 30 * i + 1, clock)  # the live key: one every 30 s
            assert _rate_rows(repo) <= limit, i
    finally:
        repo.dispose()


@pytest.mark.postgres
def test_no_60_second_window_ever_holds_more_than_the_limit(url: str) -> None:
    limit = 4
    repo, clock, cid, key = _setup(url, limit=limit)
    rng = random.Random(47)
    try:
        at, admitted = T0, []
        for _ in range(120):
            at += rng.choice((0.0, 0.001, 0.5, 3.0, 7.5, 14.999, 15.0, 29.0))
            out = _ask(repo, cid, key, at, clock)
            if isinstance(out, Charged):
                admitted.append(at)
            else:
                # Truthful: it would not have been admitted before the oldest left.
                in_window = [t for t in admitted if t > at - 60]
                assert len(in_window) == limit
                assert in_window[0] + 60 <= at + out.retry_after_s < in_window[0] + 61
        # At most `limit` in any window (t, t + 60); the limit is reached, so it binds.
        for i in range(limit, len(admitted)):
            assert admitted[i] - admitted[i - limit] >= 60, admitted[i - limit : i + 1]
        assert len(admitted) > 2 * limit
        # Other principals are never limited by the key's window.
        assert isinstance(_ask(repo, cid, INTERNAL, at, clock), Charged)
    finally:
        repo.dispose()


@pytest.mark.postgres
def test_concurrent_charges_of_one_key_take_exactly_the_limit(url: str) -> None:
    repo, _clock, cid, key = _setup(url, limit=5)

    async def burst() -> list[Any]:
        reqs = [repo.charge_request(cid, key, 1.0, 0.1, 0.0) for _ in range(20)]
        return await asyncio.gather(*(repo.charge(r) for r in reqs))

    try:
        outs = asyncio.run(burst())
        assert sum(isinstance(o, Charged) for o in outs) == 5
        assert all(
            o.reason == "rate" and o.retry_after_s == 60 for o in outs if isinstance(o, Refused)
        )
    finally:
        repo.dispose()
