"""bounded storage: artifacts stored by content (chunks shared between artifacts), retention of terminal items, and
legal holds (crewwork/store/retention.py, docs/operations.md "Retention")

Expand only, as every migration here: the previous release's code runs on this schema unchanged (it inserts
artifacts with their bytes inline, which stays valid; it never sees a compacted artifact, since only the artifacts of
items that ended are compacted, after CREWWORK_RETENTION_COMPACT_AFTER_S). `artifacts.content` becomes nullable: NULL
for an artifact whose bytes are in `artifact_chunks` (its `artifact_parts` say which, in order), or that retention
removed (`removed_at`; its name, size and SHA-256 stay, which is what a signed statement names).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_INLINE = "content IS NOT NULL AND size >= 2048"


def upgrade() -> None:
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.alter_column("content", existing_type=sa.LargeBinary(), nullable=True)
        batch_op.add_column(sa.Column("removed_at", sa.Float(), nullable=True))
    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("legal_hold", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("retained_at", sa.Float(), nullable=True))
    op.create_table(
        "artifact_chunks",
        sa.Column("sha256", sa.String(length=64), primary_key=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("encoding", sa.String(length=16), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("referenced_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "artifact_parts",
        sa.Column("artifact_id", sa.String(length=64), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("chunk", sa.String(length=64), nullable=False),
    )
    op.create_index("ix_artifact_parts_chunk", "artifact_parts", ["chunk"])
    # The compaction's and the reaper's walks: the inline artifacts worth compacting (2 KiB
    # bytes or more: a smaller one would cost a chunk row and a part row for what its own row holds), and the items
    # that ended, oldest first.
    op.create_index(
        "ix_artifacts_inline",
        "artifacts",
        ["created_at", "id"],
        postgresql_where=sa.text(_INLINE),
        sqlite_where=sa.text(_INLINE),
    )
    op.create_index(
        "ix_work_items_unretained",
        "work_items",
        ["updated_at", "id"],
        postgresql_where=sa.text("retained_at IS NULL"),
        sqlite_where=sa.text("retained_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_work_items_unretained", table_name="work_items")
    op.drop_index("ix_artifacts_inline", table_name="artifacts")
    op.drop_index("ix_artifact_parts_chunk", table_name="artifact_parts")
    op.drop_table("artifact_parts")
    op.drop_table("artifact_chunks")
    with op.batch_alter_table("work_items", schema=None) as batch_op:
        batch_op.drop_column("retained_at")
        batch_op.drop_column("legal_hold")
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_column("removed_at")
