"""An index on (created_at, id), the order GET /v1/contexts pages in (keyset cursor).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_INDEX = "ix_dpicl_contexts_created_at_id"


def upgrade() -> None:
    # if_not_exists: a database built by create_all from the current models has it already.
    op.create_index(_INDEX, "dpicl_contexts", ["created_at", "id"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="dpicl_contexts")
