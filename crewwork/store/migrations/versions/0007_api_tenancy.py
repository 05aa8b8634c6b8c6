"""the submission hash of an idempotent work item (a repeated key with another payload is a conflict) and the
shared rate-limit buckets of the API processes

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("submission_hash", sa.String(length=64), nullable=True))
    op.create_table(
        "rate_limits",
        sa.Column("key", sa.String(length=300), primary_key=True),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.Column("checked_at", sa.Float(), nullable=False),
        sa.Column("allowed", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_rate_limits_tat", "rate_limits", ["tat"])


def downgrade() -> None:
    op.drop_index("ix_rate_limits_tat", table_name="rate_limits")
    op.drop_table("rate_limits")
    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.drop_column("submission_hash")
