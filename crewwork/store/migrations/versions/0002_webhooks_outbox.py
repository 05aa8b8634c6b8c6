"""webhooks, the durable outbox, and list indexes

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("event_types", sa.String(length=500), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhooks_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "outbox",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("webhook_id", sa.String(length=64), nullable=False),
        sa.Column("work_item_id", sa.String(length=64), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_due", ["status", "next_attempt_at"], unique=False)
        batch_op.create_index("ix_outbox_webhook", ["webhook_id", "id"], unique=False)

    if op.get_bind().dialect.name == "postgresql":
        # Label filters (`labels @> {...}`) on PostgreSQL; the column is JSON, so index its jsonb form.
        op.execute("CREATE INDEX ix_work_items_labels ON work_items USING gin ((labels::jsonb) jsonb_path_ops)")
        # Keyset pagination filtered by kind.
        op.create_index("ix_work_items_tenant_kind_created", "work_items", ["tenant_id", "kind", "created_at", "id"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_work_items_tenant_kind_created", table_name="work_items")
        op.execute("DROP INDEX IF EXISTS ix_work_items_labels")
    op.drop_table("outbox")
    op.drop_table("webhooks")
