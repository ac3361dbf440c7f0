"""Group commit of charges: the concurrent charges of one process share one transaction.

Every answer is charged before it runs (:mod:`dpicl.store.charges`). One transaction per
charge made concurrency cost its write: at concurrency 16 on the oracle engine a third of
the server's samples waited for this process's SQLite write lock and a sixth were in a
commit (issue 30), and on PostgreSQL concurrent charges of one context queue on its row lock,
each holding it through its own commit. Here a charge that finds no group of this process
being written is written at once, alone, exactly as before (no wait at concurrency 1).
Charges that arrive while a group is being written queue, and go together, in arrival order,
as soon as it is done (or once they have waited ``window_s``, whichever comes first: a
stalled transaction, such as one waiting for another process's row lock, does not hold the
others longer than that). A group is one transaction (:func:`~dpicl.store.charges.
charge_group`): one trip to a storage thread, one lock, one commit for all of them.

Why it stays exact:

* each member runs the same conditional UPDATEs as a charge alone (the key's row, then the
  context's), in the group's transaction, so it is checked against its context's (and key's)
  remaining budget and rate window as the members before it left them: the outcome of a
  group is that of its members charged one after another, in order;
* a refused member leaves nothing behind and touches no other member: its only write is
  the context's conditional UPDATE, which a refusal does not apply, or, with a key row (two
  conditional UPDATEs), it runs inside a SAVEPOINT that the refusal rolls back. It gets its
  own :class:`~dpicl.store.charges.Refused` (and the ledger records its refusal as before,
  in a transaction of its own); the admitted members' spend rows follow in one INSERT;
* across processes nothing changed: the conditional UPDATEs are still atomic on the locked
  row (PostgreSQL re-evaluates their WHERE clause after another transaction commits; SQLite
  has one writer), the group's rows are locked keys first, then contexts, each in id order,
  the order a single charge and a refund follow, so no two transactions wait in a cycle;
* a transaction that fails (the database, its deadline, its commit) fails every member with
  the same :class:`~dpicl.errors.StorageUnavailable`: nothing was half charged, since the
  members' changes were all in the one transaction. Its outcome is unknown only where a
  single charge's was (a commit that failed or ran past the deadline), and then every
  member's charge stays spent, as a single one does (docs/privacy.md);
* a charge written alone runs in its caller's task, so a caller that is cancelled aborts
  its database call as before (store/deadline.py); a grouped member whose caller is gone
  before its group starts is dropped, charged nothing; one cancelled later may be charged,
  its answer never released: spent, never overspent.

``window_s`` 0 turns grouping off: one transaction per charge (``DPICL_LEDGER_GROUP_COMMIT_MS``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from sqlalchemy import Connection

from dpicl.store.charges import (
    Charged,
    ChargeRequest,
    ChargeStatements,
    Refused,
    Rollback,
    charge,
    charge_group,
)

__all__ = ["MAX_GROUP", "GroupCommit"]

T = TypeVar("T")

#: The most charges one transaction takes (a burst larger than this is several groups).
MAX_GROUP = 64


class WriteTx(Protocol):
    """Runs ``fn`` in one write transaction on a storage thread, committed
    (:meth:`dpicl.store.database.Database.run_core`)."""

    def __call__(self, fn: Callable[[Connection], T], /) -> Awaitable[T]: ...


_Member = tuple[ChargeRequest, "asyncio.Future[Charged | Refused]"]


class GroupCommit:
    """The charges of one repository, grouped into transactions (see the module docstring)."""

    def __init__(
        self,
        write: WriteTx,
        statements: ChargeStatements,
        *,
        window_s: float,
        max_group: int = MAX_GROUP,
    ) -> None:
        if window_s < 0:
            raise ValueError(f"the group commit window must be >= 0 s, got {window_s}")
        if max_group < 1:
            raise ValueError(f"a group must take at least one charge, got {max_group}")
        self._write = write
        self._st = statements
        self.window_s = window_s
        self.max_group = max_group
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[_Member] = deque()
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Groups written and charges in them (tests and the benchmark read these).
        self.groups = 0
        self.grouped = 0

    async def charge(self, req: ChargeRequest) -> Charged | Refused:
        """Charge ``req`` (in a group when others are being written); its own outcome."""
        if self.window_s == 0:
            return await self._one(req)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests run several): nothing carries
            self._loop, self._queue, self._in_flight, self._timer = loop, deque(), 0, None
        if self._in_flight == 0 and not self._queue:
            # Alone: written at once, in the caller's own task, so that a caller cancelled
            # meanwhile aborts its database call exactly as without grouping.
            self._in_flight += 1
            try:
                out = await self._one(req)
            finally:
                if self._loop is loop:
                    self._in_flight -= 1
                    if self._queue:  # they waited for this charge: they go now
                        self._start(loop)
            self.groups += 1
            self.grouped += 1
            return out
        fut: asyncio.Future[Charged | Refused] = loop.create_future()
        self._queue.append((req, fut))
        if self._in_flight == 0 or len(self._queue) >= self.max_group:
            self._start(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self.window_s, self._window_closed, loop)
        return await fut

    async def _one(self, req: ChargeRequest) -> Charged | Refused:
        """One charge in a transaction of its own (a refusal rolls it back)."""
        try:
            return await self._write(lambda conn: charge(conn, self._st, req))
        except Rollback as exc:
            return exc.refused

    def _window_closed(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self._queue:
            self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the next group off the queue and write it."""
        group: list[_Member] = []
        while self._queue and len(group) < self.max_group:
            member = self._queue.popleft()
            if not member[1].done():  # its caller is gone: charge nothing
                group.append(member)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._queue:  # more than one group's worth: the rest wait at most the window
            self._timer = loop.call_later(self.window_s, self._window_closed, loop)
        if not group:
            return
        self._in_flight += 1
        task = loop.create_task(self._run(group))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.get_loop() is not self._loop:
            return
        self._in_flight -= 1
        if self._queue:  # they waited for this group: they go now
            self._start(task.get_loop())

    async def _run(self, group: list[_Member]) -> None:
        reqs = [req for req, _ in group]
        try:
            if len(reqs) == 1:
                outs: list[Charged | Refused] = [await self._one(reqs[0])]
            else:
                outs = await self._write(lambda conn: charge_group(conn, self._st, reqs))
        except asyncio.CancelledError:
            for _, fut in group:
                fut.cancel()
            raise
        except Exception as exc:  # the transaction failed: so does every member
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.groups += 1
        self.grouped += len(reqs)
        for (_, fut), out in zip(group, outs, strict=True):
            if not fut.done():
                fut.set_result(out)
