"""forge intake: repositories subscribed to their forge's webhooks, the deliveries they accepted (deduplicated by
the forge's delivery id), the triggers queued for the intake, once per trigger, and the progress comment of each
work item a trigger made (docs/forge.md)

Expand only: four new tables; the previous release's code never reads them.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forge_subscriptions",
        sa.Column("id", sa.String(length=64), primary_key=True),
        sa.Column("tenant_id", sa.String(length=64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
        sa.Column(
            "repository_id",
            sa.String(length=64),
            sa.ForeignKey("repositories.id", ondelete="CASCADE"),
            nullable=False,
            unique=True,
        ),
        sa.Column("dialect", sa.String(length=16), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_forge_subscriptions_tenant_id", "forge_subscriptions", ["tenant_id"])
    op.create_table(
        "forge_deliveries",
        sa.Column(
            "subscription_id",
            sa.String(length=64),
            sa.ForeignKey("forge_subscriptions.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("delivery_id", sa.String(length=100), primary_key=True),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_forge_deliveries_received_at", "forge_deliveries", ["received_at"])
    op.create_table(
        "forge_triggers",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column(
            "subscription_id",
            sa.String(length=64),
            sa.ForeignKey("forge_subscriptions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("trigger_key", sa.String(length=160), nullable=False),
        sa.Column("trigger", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("work_item_id", sa.String(length=64), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("done_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("subscription_id", "trigger_key", name="uq_forge_triggers_key"),
    )
    op.create_index("ix_forge_triggers_due", "forge_triggers", ["status", "next_attempt_at"])
    op.create_table(
        "forge_progress",
        sa.Column("work_item_id", sa.String(length=64), primary_key=True),
        sa.Column(
            "subscription_id",
            sa.String(length=64),
            sa.ForeignKey("forge_subscriptions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("issue_number", sa.Integer(), nullable=False),
        sa.Column("comment_id", sa.BigInteger(), nullable=True),
        sa.Column("posted", sa.String(length=64), nullable=True),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
    )
    op.create_index("ix_forge_progress_due", "forge_progress", ["done", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_forge_progress_due", table_name="forge_progress")
    op.drop_table("forge_progress")
    op.drop_index("ix_forge_triggers_due", table_name="forge_triggers")
    op.drop_table("forge_triggers")
    op.drop_index("ix_forge_deliveries_received_at", table_name="forge_deliveries")
    op.drop_table("forge_deliveries")
    op.drop_index("ix_forge_subscriptions_tenant_id", table_name="forge_subscriptions")
    op.drop_table("forge_subscriptions")
