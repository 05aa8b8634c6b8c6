"""webhook secret rotation (previous secret with an expiry) and the trace context of outbox rows

Revision ID: 0005_ecosystem
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_ecosystem"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("previous_secret", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("previous_secret_expires_at", sa.Float(), nullable=True))
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("trace_context", sa.String(length=512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("trace_context")
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.drop_column("previous_secret_expires_at")
        batch_op.drop_column("previous_secret")
