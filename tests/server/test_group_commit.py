"""Group commit of charges (issue 30, item 3; dpicl.store.group_commit): concurrent charges
of one process share a transaction, each checked against its own context's and key's
budget and rate window in order, each with its own outcome and spend row; a refused member
leaves the others alone, a failed transaction fails every member and charges nothing."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError

from dpicl.errors import StorageUnavailable
from dpicl.store.charges import Charged, Refused
from dpicl.store.keys import INTERNAL, Principal, insert_key, new_key_id, secret_hash
from dpicl.store.models import ContextRow, SpendRow
from dpicl.store.repository import ContextRepository, new_context_id

N = 24


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'group.db'}"
    else:
        yield request.getfixturevalue("pg_url")


def _repo(url: str, window_s: float = 0.005) -> ContextRepository:
    repo = ContextRepository(url, group_commit_s=window_s)
    repo.migrate()
    return repo


async def _context(repo: ContextRepository, mu2_max: float | None) -> str:
    cid = new_context_id()
    row = ContextRow(
        id=cid,
        task="classification",
        labels=["a", "b"],
        exemplars=[],
        template="{input}",
        mechanism={"name": "voting"},
        budget=None,
        mu2_max=mu2_max,
        max_queries=None,
    )
    await repo.add(row)
    return cid


async def _key(repo: ContextRepository, *, rate_limit: int | None) -> Principal:
    values: dict[str, Any] = {
        "id": new_key_id(),
        "name": "group",
        "secret_hash": secret_hash(new_key_id()),
        "tenant": "t",
        "contexts": None,
        "budget": None,
        "mu2_max": None,
        "rate_limit": rate_limit,
        "created_at": datetime.now(UTC),
        "revoked_at": None,
    }
    key = await repo.run(lambda conn: insert_key(conn, values), write=True)
    return key.principal()


def _spends(repo: ContextRepository) -> Counter[str]:
    with repo.engine.connect() as conn:
        rows = conn.execute(select(SpendRow.outcome, func.count()).group_by(SpendRow.outcome))
        return Counter({outcome: int(n) for outcome, n in rows})


def test_concurrent_charges_share_transactions_and_never_overspend(url: str) -> None:
    async def main() -> tuple[list[Charged | Refused], ContextRepository, str]:
        repo = _repo(url)
        cid = await _context(repo, mu2_max=10.0)
        reqs = [repo.charge_request(cid, INTERNAL, 1.0, 0.1, 0.0) for _ in range(N)]
        outs = await asyncio.gather(*(repo.charge(r) for r in reqs))
        return outs, repo, cid

    outs, repo, cid = asyncio.run(main())
    try:
        charged = [o for o in outs if isinstance(o, Charged)]
        assert len(charged) == 10
        assert all(isinstance(o, Refused) and o.reason == "context" for o in outs[10:])
        # In arrival order: each member saw the ledger the members before it left.
        assert [o.queries for o in charged] == list(range(1, 11))
        assert [o.mu2_spent for o in charged] == [float(i) for i in range(1, 11)]
        assert len({o.spend_id for o in charged}) == 10
        assert _spends(repo) == Counter(answered=10)
        # Grouped: fewer transactions than charges (the first goes alone, the rest wait).
        gc = repo.group_commit
        assert gc.grouped == N and gc.groups < N
        ctx = asyncio.run(repo.get(cid))
        assert ctx is not None and ctx.queries == 10 and ctx.mu2_spent == 10.0
    finally:
        repo.dispose()


def test_a_refused_member_does_not_fail_the_others(url: str) -> None:
    async def main() -> tuple[list[Charged | Refused], ContextRepository, list[str], Principal]:
        repo = _repo(url)
        rich = await _context(repo, mu2_max=None)
        poor = await _context(repo, mu2_max=0.5)
        limited = await _key(repo, rate_limit=3)
        gone = new_context_id()  # no such row: refused by the UPDATE itself
        reqs = []
        for i in range(N):
            cid, who = [(rich, INTERNAL), (poor, INTERNAL), (gone, INTERNAL), (rich, limited)][
                i % 4
            ]
            reqs.append(repo.charge_request(cid, who, 1.0, 0.1, 0.0))
        outs = await asyncio.gather(*(repo.charge(r) for r in reqs))
        return outs, repo, [rich, poor], limited

    outs, repo, (rich, poor), limited = asyncio.run(main())
    try:
        kinds = [
            o.reason if isinstance(o, Refused) else "charged" for o in outs
        ]  # per member, in order
        assert kinds[0::4] == ["charged"] * (N // 4)
        assert kinds[1::4] == ["context"] * (N // 4)
        assert kinds[2::4] == ["context"] * (N // 4)
        assert kinds[3::4] == ["charged"] * 3 + ["rate"] * (N // 4 - 3)
        assert repo.group_commit.groups < N
        ctx = asyncio.run(repo.get(rich))
        assert ctx is not None and ctx.queries == N // 4 + 3
        other = asyncio.run(repo.get(poor))
        assert other is not None and other.queries == 0 and other.mu2_spent == 0.0
        assert _spends(repo) == Counter(answered=N // 4 + 3)
        with repo.engine.connect() as conn:
            count = conn.execute(
                select(func.sum(SpendRow.mu2)).where(SpendRow.key_id == limited.key_id)
            ).scalar_one()
        assert count == 3.0
    finally:
        repo.dispose()


def test_a_failed_transaction_fails_every_member_and_charges_nothing(url: str) -> None:
    repo = _repo(url)
    inserts = 0

    def fail_after_the_first_spend_row(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        nonlocal inserts
        if sql.lstrip().upper().startswith("INSERT INTO DPICL_SPEND "):
            inserts += 1
            if inserts >= 2:
                raise OperationalError(sql, None, RuntimeError("the database failed mid-group"))

    async def main() -> tuple[list[Any], str]:
        cid = await _context(repo, mu2_max=None)
        reqs = [repo.charge_request(cid, INTERNAL, 1.0, 0.1, 0.0) for _ in range(8)]
        event.listen(repo.engine, "before_cursor_execute", fail_after_the_first_spend_row)
        try:
            # The first charge is written alone; the other 7 queue behind it as one group,
            # whose spend rows (written after every member's UPDATEs) fail.
            outs = await asyncio.gather(*(repo.charge(r) for r in reqs), return_exceptions=True)
        finally:
            event.remove(repo.engine, "before_cursor_execute", fail_after_the_first_spend_row)
        return outs, cid

    try:
        outs, cid = asyncio.run(main())
        assert isinstance(outs[0], Charged), outs
        assert all(isinstance(o, StorageUnavailable) for o in outs[1:]), outs
        ctx = asyncio.run(repo.get(cid))
        assert ctx is not None and ctx.queries == 1 and ctx.mu2_spent == 1.0
        assert _spends(repo) == Counter(answered=1)
    finally:
        repo.dispose()


def test_a_lone_charge_does_not_wait_for_the_window(tmp_path: Path) -> None:
    repo = _repo(f"sqlite:///{tmp_path / 'lone.db'}", window_s=30.0)
    try:

        async def main() -> float:
            cid = await _context(repo, mu2_max=None)
            t0 = time.monotonic()
            for _ in range(3):
                assert isinstance(
                    await repo.charge(repo.charge_request(cid, INTERNAL, 1.0, 0.1, 0.0)),
                    Charged,
                )
            return time.monotonic() - t0

        assert asyncio.run(main()) < 10.0  # never the 30 s window
        assert repo.group_commit.groups == 3 and repo.group_commit.grouped == 3
    finally:
        repo.dispose()


def test_window_zero_is_one_transaction_per_charge(tmp_path: Path) -> None:
    repo = _repo(f"sqlite:///{tmp_path / 'single.db'}", window_s=0.0)
    try:

        async def main() -> list[Charged | Refused]:
            cid = await _context(repo, mu2_max=5.0)
            reqs = [repo.charge_request(cid, INTERNAL, 1.0, 0.1, 0.0) for _ in range(8)]
            return await asyncio.gather(*(repo.charge(r) for r in reqs))

        outs = asyncio.run(main())
        assert sum(isinstance(o, Charged) for o in outs) == 5
        assert repo.group_commit.groups == 0  # the grouping path never ran
        assert _spends(repo) == Counter(answered=5)
    finally:
        repo.dispose()
