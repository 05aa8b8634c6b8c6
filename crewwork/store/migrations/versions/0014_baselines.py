"""baselines and flaky tests: the validation command's result on a base commit, cached per tenant, repository,
base commit and definition, and each repository's flaky tests (docs/lifecycle.md, "Baseline and flaky tests")

Expand only: two new tables; the previous release's code never reads them.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "validation_baselines",
        sa.Column("tenant_id", sa.String(length=64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("repository", sa.String(length=300), primary_key=True),
        sa.Column("base_commit", sa.String(length=64), primary_key=True),
        sa.Column("definition", sa.String(length=64), primary_key=True),
        sa.Column("facts", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "flaky_tests",
        sa.Column("tenant_id", sa.String(length=64), sa.ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("repository", sa.String(length=300), primary_key=True),
        sa.Column("test_id", sa.String(length=1000), primary_key=True),
        sa.Column("times", sa.Integer(), nullable=False),
        sa.Column("first_seen_at", sa.Float(), nullable=False),
        sa.Column("last_seen_at", sa.Float(), nullable=False),
        sa.Column("last_work_item_id", sa.String(length=64), nullable=False),
        sa.Column("last_attempt", sa.Integer(), nullable=False),
        sa.Column("last_runs", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("flaky_tests")
    op.drop_table("validation_baselines")
