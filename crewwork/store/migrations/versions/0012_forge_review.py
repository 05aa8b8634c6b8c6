"""forge review: which attempt of a work item is shown for review on the forge (its delivery branch pushed as a review
commit, its pull request opened), so the intake pushes each attempt awaiting review once (docs/forge.md)

Expand only: two nullable columns on forge_progress; the previous release's code never reads them.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("forge_progress", sa.Column("review_shown", sa.String(length=100), nullable=True))
    op.add_column("forge_progress", sa.Column("review_pull_url", sa.String(length=2000), nullable=True))


def downgrade() -> None:
    op.drop_column("forge_progress", "review_pull_url")
    op.drop_column("forge_progress", "review_shown")
