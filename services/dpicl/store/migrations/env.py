"""Alembic environment: always run programmatically with a connection (see ``upgrade``)."""

from __future__ import annotations

from alembic import context

from dpicl.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
