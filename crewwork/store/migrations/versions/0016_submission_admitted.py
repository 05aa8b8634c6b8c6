"""PostgreSQL: a submission and its admission in one round trip (`crewwork_submit`, issue 48)

A submission was two statements of the API, each its own transaction and commit: the work item's row with its
`submitted` event (WorkItemStore.create_work_item), then the admission's fenced write (`crewwork_fenced_write` with
the 'admit' operation, crewwork/admission/starts.py). `crewwork_submit` runs the same two in one call, in the same
order, each with its own snapshot (a VOLATILE PL/pgSQL function takes one per statement under READ COMMITTED): the
queue's room, the row and its event at rank SUBMISSION, then the admission at rank ADMISSION through
`crewwork_fenced_write` itself — the tenant's lock, the counts after it, `admitted` or `queued` with its event and
webhook rows. One commit instead of two, and the row is never seen `submitted` by anyone else.

Expand only: a new function; the previous release never calls it, and this release calls it only on PostgreSQL with
server-side writes (the two statements stay the path for SQLite and `CREWWORK_STORE_SERVER_WRITES=false`).

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# JSON values come as the JSON text the two-statement path stores (SQLAlchemy's JSON type binds `json.dumps`), cast to
# `json`: `jsonb` would rewrite them (keys sorted, 1e16 made an integer). `p_cap` NULL: no queue limit. Returns NULL
# when the tenant's queue has no room (nothing stored), else the row's `created_at` and the admission's write.
SUBMIT = r"""
CREATE OR REPLACE FUNCTION crewwork_submit(
    p_wid text, p_tenant text, p_kind text, p_spec text, p_idempotency_key text, p_submission_hash text,
    p_labels text, p_repo_url text, p_base_commit text, p_workflow_id text, p_mock boolean, p_event text,
    p_cap int, p_waiting text[], p_max_in_flight int, p_terminal text[], p_in_flight text[], p_trace text
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    v_now float8;
    waiting bigint;
BEGIN
    IF p_cap IS NOT NULL THEN
        SELECT count(*) INTO waiting FROM (
            SELECT 1 FROM work_items w WHERE w.tenant_id = p_tenant AND w.state = ANY (p_waiting) LIMIT p_cap
        ) q;
        IF waiting >= p_cap THEN
            RETURN NULL;
        END IF;
    END IF;
    v_now := extract(epoch from clock_timestamp())::float8;
    INSERT INTO work_items (id, tenant_id, kind, state, spec, idempotency_key, submission_hash, labels, repo_url,
                            base_commit, workflow_id, reason, result_rank, state_rank, attempt_count,
                            delivery_branch, landed_commit, mock, fence_rank, created_at, updated_at)
    VALUES (p_wid, p_tenant, p_kind, 'submitted', p_spec::json, p_idempotency_key, p_submission_hash,
            p_labels::json, p_repo_url, p_base_commit, p_workflow_id, '', NULL, NULL, 0, NULL, NULL, p_mock, 0,
            v_now, v_now);
    INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
    VALUES (p_wid, p_tenant, 'submitted', p_event::json, 0, v_now);
    -- The admission at rank ADMISSION = Rank(0, 1) (crewwork/admission/starts.py), as its own call makes it.
    RETURN jsonb_build_object(
        'created_at', v_now,
        'write', crewwork_fenced_write(
            p_wid, p_tenant, 1, 'admission',
            jsonb_build_array(jsonb_build_object('op', 'admit', 'max', p_max_in_flight, 'writer', 'admission')),
            p_terminal, p_in_flight, NULL, p_trace, NULL, NULL, NULL, NULL, NULL, NULL));
END
$fn$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(SUBMIT)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "DROP FUNCTION IF EXISTS crewwork_submit(text, text, text, text, text, text, text, text, text, text, boolean, "
        "text, int, text[], int, text[], text[], text)"
    )
