"""repository checks: the named checks a registration declares for its work items (docs/checks.md)

Expand only: one nullable column; the previous release's code never reads it.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN on both stores (no table rebuild under the previous release's running processes).
    op.add_column("repositories", sa.Column("checks", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("repositories") as batch:
        batch.drop_column("checks")
