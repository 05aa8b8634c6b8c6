"""repositories owned by tenants (issue 14): the only repositories a tenant's work items may name

Revision ID: 0006
Revises: 0005_ecosystem
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005_ecosystem"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "repositories",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("default_ref", sa.String(length=256), nullable=False),
        sa.Column("credential", sa.String(length=128), nullable=True),
        sa.Column("protect_paths", sa.JSON(), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=True),
        sa.Column("auto_registered", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant_id", "url", name="uq_repositories_tenant_url"),
    )


def downgrade() -> None:
    op.drop_table("repositories")
