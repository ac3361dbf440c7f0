"""The SQL trial log (SQLAlchemy 2.0): runs, the contexts they created, and every trial.

SQLite file by default (``./runs/audit.db``), PostgreSQL by URL
(``postgresql+psycopg://user@host/db``). The tables (``runs``, ``run_contexts``, ``trials``)
are :mod:`.tables`; this module holds the records a run reads and :class:`TrialStore`.

Trials are written in batches, one transaction each, and inserts are idempotent (existing
indices are skipped and the insert itself does ON CONFLICT DO NOTHING), so a run killed at
any point and resumed neither loses nor duplicates a trial: what was committed is kept and
everything else is re-run. A batch commits together with the run's wall-time and LLM-call
counters.

``schema`` places the tables in a PostgreSQL schema (tests use one per test); on SQLite it
must be None.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

from sqlalchemy import (
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from dpicl_audit.context_info import ContextInfo
from dpicl_audit.errors import InvalidAuditInput, RunNotFound
from dpicl_audit.jsontypes import JsonMapping, JsonObject
from dpicl_audit.store.db import (
    DEFAULT_DB,
    open_engine,
    resolve_db_url,
    shown_url,
    sqlite_file_missing,
)
from dpicl_audit.store.tables import metadata, run_contexts, runs, trials

__all__ = [
    "DEFAULT_DB",
    "ContextRecord",
    "RunRecord",
    "TrialRecord",
    "TrialStore",
    "resolve_db_url",
    "sqlite_file_missing",
]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    name: str | None
    kind: str
    created_at: dt.datetime
    updated_at: dt.datetime
    status: str
    plan: JsonMapping
    design: JsonMapping | None
    versions: JsonMapping
    results: JsonMapping | None
    wall_time_s: float
    llm_calls: int
    queries: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ContextRecord:
    setting: str
    world: int
    epsilon: float
    context_id: str
    info: ContextInfo


@dataclass(frozen=True, slots=True)
class TrialRecord:
    setting: str
    trial_index: int
    world: int
    context_id: str
    query: str
    observation: JsonMapping
    decision: int | None
    latency_s: float
    epsilon: float | None = None
    score: float | None = None
    created_at: dt.datetime = field(default_factory=_now)


class TrialStore:
    """The trial log behind one database URL."""

    def __init__(self, url: str | Path | None = None, *, schema: str | None = None) -> None:
        self.url = resolve_db_url(url)
        self.dialect = make_url(self.url).get_backend_name()
        self.engine = open_engine(self.url, schema)
        self.schema = schema
        try:
            metadata.create_all(self.engine)
        except SQLAlchemyError as exc:
            self.engine.dispose()
            # The driver's own words (a file that is not a database, a server that does not
            # answer), without SQLAlchemy's statement and background link.
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise InvalidAuditInput(
                f"--db {self._where()!r}: cannot open the trial log "
                f"({type(exc).__name__}: {reason})"
            ) from exc

    def dispose(self) -> None:
        self.engine.dispose()

    # ----------------------------------------------------------------- runs

    def create_run(
        self,
        run_id: str,
        *,
        plan: JsonObject,
        versions: JsonObject,
        kind: str = "run",
        name: str | None = None,
        design: JsonObject | None = None,
    ) -> None:
        now = _now()
        try:
            self._insert_run(run_id, now, plan, versions, kind, name, design)
        except IntegrityError as exc:
            raise InvalidAuditInput(
                f"run {run_id!r} already exists in {self._where()}; `dpicl-audit resume "
                f"{run_id}` continues it, or give another --run-id"
            ) from exc

    def _insert_run(
        self,
        run_id: str,
        now: dt.datetime,
        plan: JsonObject,
        versions: JsonObject,
        kind: str,
        name: str | None,
        design: JsonObject | None,
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                insert(runs).values(
                    id=run_id,
                    name=name,
                    kind=kind,
                    created_at=now,
                    updated_at=now,
                    status="running",
                    plan=plan,
                    design=design,
                    versions=versions,
                    results=None,
                    wall_time_s=0.0,
                    llm_calls=0,
                    queries=0,
                )
            )

    def get_run(self, run_id: str) -> RunRecord:
        with self.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).mappings().first()
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in {self._where()}")
        return _run_record(row)

    def list_runs(self) -> list[RunRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(runs).order_by(runs.c.created_at)).mappings().all()
        return [_run_record(r) for r in rows]

    def update_run(self, run_id: str, **values: Any) -> None:
        """Set columns of a run (status, results, versions, design, error)."""
        allowed = {"status", "results", "versions", "design", "error", "name"}
        bad = set(values) - allowed
        if bad:
            raise InvalidAuditInput(f"cannot update run columns {sorted(bad)}")
        with self.engine.begin() as conn:
            res = conn.execute(
                update(runs).where(runs.c.id == run_id).values(updated_at=_now(), **values)
            )
            if res.rowcount == 0:
                raise RunNotFound(f"no run {run_id!r} in {self._where()}")

    def add_usage(self, run_id: str, *, wall_time_s: float = 0.0, llm_calls: int = 0) -> None:
        with self.engine.begin() as conn:
            self._add_usage(conn, run_id, wall_time_s, llm_calls, 0)

    def _add_usage(
        self, conn: Connection, run_id: str, wall: float, llm_calls: int, queries: int
    ) -> None:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(
                wall_time_s=runs.c.wall_time_s + float(wall),
                llm_calls=runs.c.llm_calls + int(llm_calls),
                queries=runs.c.queries + int(queries),
                updated_at=_now(),
            )
        )

    # ----------------------------------------------------------------- contexts

    def save_context(
        self,
        run_id: str,
        *,
        setting: str,
        world: int,
        epsilon: float,
        context_id: str,
        info: ContextInfo,
    ) -> None:
        """Record (or replace) the server context of one (setting, world)."""
        with self.engine.begin() as conn:
            conn.execute(
                run_contexts.delete().where(
                    (run_contexts.c.run_id == run_id)
                    & (run_contexts.c.setting == setting)
                    & (run_contexts.c.world == int(world))
                )
            )
            conn.execute(
                insert(run_contexts).values(
                    run_id=run_id,
                    setting=setting,
                    world=int(world),
                    epsilon=float(epsilon),
                    context_id=context_id,
                    info=info,
                    created_at=_now(),
                )
            )

    def contexts(self, run_id: str) -> dict[tuple[str, int], ContextRecord]:
        with self.engine.connect() as conn:
            rows = (
                conn.execute(select(run_contexts).where(run_contexts.c.run_id == run_id))
                .mappings()
                .all()
            )
        return {
            (r["setting"], int(r["world"])): ContextRecord(
                setting=r["setting"],
                world=int(r["world"]),
                epsilon=float(r["epsilon"]),
                context_id=r["context_id"],
                # Saved from a ContextInfo (save_context), read back as it was written.
                info=cast(ContextInfo, dict(r["info"])),
            )
            for r in rows
        }

    # ----------------------------------------------------------------- trials

    def add_trials(
        self,
        run_id: str,
        records: Sequence[TrialRecord],
        *,
        wall_time_s: float = 0.0,
        llm_calls_per_trial: int = 0,
    ) -> int:
        """Insert a batch in one transaction, skipping indices already logged.

        Returns how many rows were new. The run's wall time, query and LLM-call counters
        advance in the same transaction (by the new rows only).
        """
        if not records:
            if wall_time_s:
                self.add_usage(run_id, wall_time_s=wall_time_s)
            return 0
        with self.engine.begin() as conn:
            settings = {r.setting for r in records}
            existing: set[tuple[str, int]] = set()
            for setting in settings:
                idx = [r.trial_index for r in records if r.setting == setting]
                for chunk in iter_chunks(idx, 500):  # stay below bound-parameter limits
                    got = conn.execute(
                        select(trials.c.trial_index).where(
                            (trials.c.run_id == run_id)
                            & (trials.c.setting == setting)
                            & (trials.c.trial_index.in_(chunk))
                        )
                    ).scalars()
                    existing.update((setting, int(i)) for i in got)
            fresh: dict[tuple[str, int], TrialRecord] = {}
            for r in records:
                key = (r.setting, r.trial_index)
                if key not in existing:
                    fresh.setdefault(key, r)
            if fresh:
                rows = [_trial_row(run_id, r) for r in fresh.values()]
                conn.execute(self._insert_ignore(), rows)
            self._add_usage(conn, run_id, wall_time_s, len(fresh) * llm_calls_per_trial, len(fresh))
        return len(fresh)

    def _insert_ignore(self) -> Any:
        keys = ["run_id", "setting", "trial_index"]
        if self.dialect == "sqlite":
            return sqlite.insert(trials).on_conflict_do_nothing(index_elements=keys)
        if self.dialect == "postgresql":
            return postgresql.insert(trials).on_conflict_do_nothing(index_elements=keys)
        return insert(trials)  # other backends: the pre-check above is the guard

    def trial_indices(self, run_id: str, setting: str) -> set[int]:
        with self.engine.connect() as conn:
            got = conn.execute(
                select(trials.c.trial_index).where(
                    (trials.c.run_id == run_id) & (trials.c.setting == setting)
                )
            ).scalars()
            return {int(i) for i in got}

    def trial_counts(self, run_id: str) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(trials.c.setting, func.count())
                .where(trials.c.run_id == run_id)
                .group_by(trials.c.setting)
            ).all()
        return {str(s): int(n) for s, n in rows}

    def trials(self, run_id: str, setting: str | None = None) -> list[TrialRecord]:
        """The logged trials of a run (one setting or all), in trial-index order."""
        cond = trials.c.run_id == run_id
        if setting is not None:
            cond = cond & (trials.c.setting == setting)
        with self.engine.connect() as conn:
            rows = (
                conn.execute(
                    select(trials).where(cond).order_by(trials.c.setting, trials.c.trial_index)
                )
                .mappings()
                .all()
            )
        return [
            TrialRecord(
                setting=r["setting"],
                trial_index=int(r["trial_index"]),
                world=int(r["world"]),
                context_id=r["context_id"],
                query=r["query"],
                observation=dict(r["observation"]),
                decision=None if r["decision"] is None else int(r["decision"]),
                latency_s=float(r["latency_s"]),
                epsilon=None if r["epsilon"] is None else float(r["epsilon"]),
                score=None if r["score"] is None else float(r["score"]),
                created_at=r["created_at"],
            )
            for r in rows
        ]

    def _where(self) -> str:
        return shown_url(self.url)


def _run_record(row: Any) -> RunRecord:
    return RunRecord(
        id=row["id"],
        name=row["name"],
        kind=row["kind"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        status=row["status"],
        plan=dict(row["plan"]),
        design=None if row["design"] is None else dict(row["design"]),
        versions=dict(row["versions"]),
        results=None if row["results"] is None else dict(row["results"]),
        wall_time_s=float(row["wall_time_s"]),
        llm_calls=int(row["llm_calls"]),
        queries=int(row["queries"]),
        error=row["error"],
    )


class _TrialRow(TypedDict):
    """A row of ``trials`` as :meth:`TrialStore.add_trials` inserts it."""

    run_id: str
    setting: str
    epsilon: float | None
    trial_index: int
    world: int
    context_id: str
    query: str
    observation: JsonMapping
    decision: int | None
    score: float | None
    latency_s: float
    created_at: dt.datetime


def _trial_row(run_id: str, r: TrialRecord) -> _TrialRow:
    return {
        "run_id": run_id,
        "setting": r.setting,
        "epsilon": r.epsilon,
        "trial_index": int(r.trial_index),
        "world": int(r.world),
        "context_id": r.context_id,
        "query": r.query,
        "observation": r.observation,
        "decision": r.decision,
        "score": r.score,
        "latency_s": float(r.latency_s),
        "created_at": r.created_at,
    }


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
