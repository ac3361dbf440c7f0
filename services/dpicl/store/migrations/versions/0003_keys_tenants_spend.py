"""Keys as records, tenants on contexts, and the spend record (issue 25).

Revision ID: 0003
Revises: 0002

Adds ``dpicl_contexts.tenant`` (NULL for every existing context: no key of a tenant reaches
it; static keys and the admin still reach all), the ``dpicl_keys`` table (hashed secrets,
scope, per-key ledger and rate window) and the ``dpicl_spend`` table. Existing rows are not
touched, so contexts and their ledgers survive; static keys (``DPICL_API_KEYS``) live in the
settings, not the database, and keep working unchanged.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dpicl_contexts") as batch:
        batch.add_column(sa.Column("tenant", sa.String(64), nullable=True))
    op.create_index(
        "ix_dpicl_contexts_tenant_created_at_id",
        "dpicl_contexts",
        ["tenant", "created_at", "id"],
    )
    op.create_table(
        "dpicl_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200)),
        sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("tenant", sa.String(64)),
        sa.Column("contexts", sa.JSON),
        sa.Column("budget", sa.JSON),
        sa.Column("mu2_spent", sa.Float, nullable=False),
        sa.Column("mu2_max", sa.Float),
        sa.Column("queries", sa.Integer, nullable=False),
        sa.Column("rate_limit", sa.Integer),
        sa.Column("rate_window", sa.BigInteger),
        sa.Column("rate_count", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
    )
    op.create_table(
        "dpicl_spend",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("context_id", sa.String(40), nullable=False),
        sa.Column("epsilon", sa.Float, nullable=False),
        sa.Column("delta", sa.Float, nullable=False),
        sa.Column("mu2", sa.Float, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
    )
    op.create_index("ix_dpicl_spend_context_id_id", "dpicl_spend", ["context_id", "id"])
    op.create_index("ix_dpicl_spend_key_id", "dpicl_spend", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_dpicl_spend_key_id", table_name="dpicl_spend")
    op.drop_index("ix_dpicl_spend_context_id_id", table_name="dpicl_spend")
    op.drop_table("dpicl_spend")
    op.drop_table("dpicl_keys")
    op.drop_index("ix_dpicl_contexts_tenant_created_at_id", table_name="dpicl_contexts")
    with op.batch_alter_table("dpicl_contexts") as batch:
        batch.drop_column("tenant")
