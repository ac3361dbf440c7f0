"""The trial log's tables (SQLAlchemy Core), which :class:`~dpicl_audit.store.log.TrialStore`
reads and writes:

``runs``          one row per audit: plan (tokens masked), design (the neighbour pair and
                  query), versions (auditor, server ``/healthz``, Python), status, results,
                  accumulated wall time and LLM calls
``run_contexts``  the server contexts a run created, one per (setting, world), so a resumed
                  run reuses them; UNIQUE(run_id, setting, world)
``trials``        one row per audit query: setting (``eps=1``), epsilon, trial index, world
                  (1 = C1 with the canary, 0 = C0), context id, query, observation (the
                  released label, or the noisy/clean votes), decision, white-box score,
                  latency and time; UNIQUE(run_id, setting, trial_index)
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

__all__ = ["metadata", "run_contexts", "runs", "trials"]

metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("id", String(80), primary_key=True),
    Column("name", String(200), nullable=True),
    Column("kind", String(20), nullable=False),  # "run" | "bootstrap"
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("status", String(20), nullable=False),  # running | completed | failed
    Column("plan", JSON, nullable=False),
    Column("design", JSON, nullable=True),
    Column("versions", JSON, nullable=False),
    Column("results", JSON, nullable=True),
    Column("wall_time_s", Float, nullable=False, default=0.0),
    Column("llm_calls", Integer, nullable=False, default=0),
    Column("queries", Integer, nullable=False, default=0),
    Column("error", Text, nullable=True),
)

run_contexts = Table(
    "run_contexts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(80), nullable=False),
    Column("setting", String(80), nullable=False),
    Column("world", Integer, nullable=False),
    Column("epsilon", Float, nullable=False),
    Column("context_id", String(128), nullable=False),
    Column("info", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("run_id", "setting", "world", name="uq_run_contexts_setting_world"),
)

trials = Table(
    "trials",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(80), nullable=False),
    Column("setting", String(80), nullable=False),
    Column("epsilon", Float, nullable=True),
    Column("trial_index", Integer, nullable=False),
    Column("world", Integer, nullable=False),
    Column("context_id", String(128), nullable=False),
    Column("query", Text, nullable=False),
    Column("observation", JSON, nullable=False),
    Column("decision", Integer, nullable=True),
    Column("score", Float, nullable=True),
    Column("latency_s", Float, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("run_id", "setting", "trial_index", name="uq_trials_setting_index"),
)
Index("ix_trials_run_setting", trials.c.run_id, trials.c.setting)
