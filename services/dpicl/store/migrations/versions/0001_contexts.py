"""The contexts table with its ledger columns (the schema ``create_all`` used to build).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dpicl_contexts",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200)),
        sa.Column("task", sa.String(20), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("exemplars", sa.JSON, nullable=False),
        sa.Column("template", sa.Text, nullable=False),
        sa.Column("mechanism", sa.JSON, nullable=False),
        sa.Column("budget", sa.JSON),
        sa.Column("mu2_spent", sa.Float, nullable=False),
        sa.Column("mu2_max", sa.Float),
        sa.Column("queries", sa.Integer, nullable=False),
        sa.Column("max_queries", sa.Integer),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("dpicl_contexts")
