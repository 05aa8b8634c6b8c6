"""the open work items (not terminal) in submission order, for the reconciler (crewwork/admission/reconcile.py)

A partial index: it holds only the items still open, so its size follows the work in flight, not the table's
history, and a pass of the reconciler reads its next batch without scanning finished items (its query names the
condition in literals, as SQLite needs to use a partial index: tests/store/test_store_open_items.py).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# crewwork.models.TERMINAL_STATES, frozen here as this revision knows them.
_OPEN = "state NOT IN ('succeeded', 'failed', 'rejected', 'cancelled', 'dead')"


def upgrade() -> None:
    op.create_index(
        "ix_work_items_open",
        "work_items",
        ["created_at", "id"],
        postgresql_where=sa.text(_OPEN),
        sqlite_where=sa.text(_OPEN),
    )


def downgrade() -> None:
    op.drop_index("ix_work_items_open", table_name="work_items")
