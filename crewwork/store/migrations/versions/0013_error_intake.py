"""error intake: repositories registered as error-reporting projects (the Sentry DSN's project and key) and the
groups their reports are counted in, one work item per group at a time (docs/errors-intake.md)

Expand only: two new tables; the previous release's code never reads them.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "error_projects",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant_id", sa.String(length=64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False),
        sa.Column(
            "repository_id",
            sa.String(length=64),
            sa.ForeignKey("repositories.id", ondelete="CASCADE"),
            nullable=False,
            unique=True,
        ),
        sa.Column("public_key", sa.String(length=64), nullable=False, unique=True),
        sa.Column("fence_secret", sa.String(length=64), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_error_projects_tenant_id", "error_projects", ["tenant_id"])
    op.create_table(
        "error_groups",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("project_id", big_id, sa.ForeignKey("error_projects.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("sample", sa.JSON(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("work_item_id", sa.String(length=64), nullable=True),
        sa.Column("previous_work_item_id", sa.String(length=64), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.UniqueConstraint("project_id", "fingerprint", name="uq_error_groups_fingerprint"),
    )
    op.create_index("ix_error_groups_due", "error_groups", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_index("ix_error_groups_due", table_name="error_groups")
    op.drop_table("error_groups")
    op.drop_index("ix_error_projects_tenant_id", table_name="error_projects")
    op.drop_table("error_projects")
