"""The sliding window's log of a key's rate limit (issue 47).

Revision ID: 0005
Revises: 0004

The rate limit was a fixed window on the clock minute (``rate_window``, ``rate_count`` of
``dpicl_keys``): up to twice the limit passed around a minute's end. Each admitted answer of
a rate-limited key now leaves a row here, and a charge counts the rows of the last 60 s.
The old columns stay, unused, so that servers of the previous version keep running during
a rolling upgrade.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TABLE = "dpicl_rate_events"
_INDEX = "ix_dpicl_rate_events_key_id_at_us"


def upgrade() -> None:
    # A database built by create_all from the current models has the table already.
    if _TABLE in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        _TABLE,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("at_us", sa.BigInteger, nullable=False),
    )
    op.create_index(_INDEX, _TABLE, ["key_id", "at_us"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name=_TABLE)
    op.drop_table(_TABLE)
