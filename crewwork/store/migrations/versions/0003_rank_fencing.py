"""fencing in scheduling order: ranks instead of database-issued tokens

Revision ID: 0003
Revises: 0002

Writes are ranked by (workflow step, Temporal attempt), not by a token the database issues when a write arrives
(crewwork/store/fencing.py). Each work item keeps the highest accepted rank in `fence_rank`; events and attempts
record the rank they were accepted with. The per-item token counters in `fences` are gone (the table keeps the
grant counters of workspace leases), and so are the execution leases.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("work_items") as b:
        b.add_column(sa.Column("fence_rank", sa.BigInteger(), nullable=False, server_default="0"))
        b.alter_column("result_token", new_column_name="result_rank")
        b.alter_column("state_token", new_column_name="state_rank")
    with op.batch_alter_table("events") as b:
        b.alter_column("token", new_column_name="rank")
    with op.batch_alter_table("attempts") as b:
        b.alter_column("token", new_column_name="rank")
    # Tokens of the old scheme are not ranks: an item written under it restarts its mark at 0, which only admits
    # writes of its (new) workflow steps.
    op.execute("UPDATE work_items SET result_rank = NULL, state_rank = NULL")
    op.execute("DELETE FROM fences WHERE key LIKE 'wi:%'")
    op.execute("DELETE FROM leases WHERE key LIKE 'wi:%'")
    op.execute("DELETE FROM lease_history WHERE key LIKE 'wi:%'")


def downgrade() -> None:
    with op.batch_alter_table("attempts") as b:
        b.alter_column("rank", new_column_name="token")
    with op.batch_alter_table("events") as b:
        b.alter_column("rank", new_column_name="token")
    with op.batch_alter_table("work_items") as b:
        b.alter_column("state_rank", new_column_name="state_token")
        b.alter_column("result_rank", new_column_name="result_token")
        b.drop_column("fence_rank")
