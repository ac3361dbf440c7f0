"""An index on (tenant, id): a tenant key's lookup of one context (issue 39).

Revision ID: 0004
Revises: 0003

A key of a tenant looks a context up by ``id = ? AND tenant = ?``. Answered from this
index, a context of another tenant is never read: its row's size (megabytes of exemplars)
cannot show in the time of the 404, which must equal that of a missing id.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_INDEX = "ix_dpicl_contexts_tenant_id"


def upgrade() -> None:
    # if_not_exists: a database built by create_all from the current models has it already.
    op.create_index(_INDEX, "dpicl_contexts", ["tenant", "id"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="dpicl_contexts")
