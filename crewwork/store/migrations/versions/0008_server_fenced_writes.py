"""PostgreSQL: a fenced write in one round trip (`crewwork_fenced_write`, called by crewwork/store/fencing.py)

The functions run the statements the Python path runs, in the same order, each with its own snapshot (a VOLATILE
PL/pgSQL function takes a new snapshot per statement under READ COMMITTED, as separate statements of a transaction
do): the item row's lock and the fence check, the stale or closed refusal with its event, the write's operations,
the tenant lock before the item's own change when the change hands its place on, the hand-off, and the mark. What
changes is only where the decisions between the statements are made: next to the data, in one implicit
transaction, instead of one round trip each from the worker (docs/performance.md, "Fourth round").

SQLite has no server-side functions; it keeps the Python path, which stays the reference for both.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# `p_rank / 1000000`: Rank.SPAN (crewwork/store/fencing.py); a test checks the two agree.
CHANGE_STATE = r"""
CREATE OR REPLACE FUNCTION crewwork_change_state(
    p_wid text, p_tenant text, p_rank bigint, p_now float8, p_state text, p_reason text, p_writer text,
    p_fields jsonb, p_event text, p_payload jsonb, p_trace text
) RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    -- The row, its mark raised to the write's rank. `p_fields` carries only the columns listed here (the caller
    -- falls back to the Python path for any other). JSON values (`result`, `p_event`, an event's or an attempt's
    -- data) come as the JSON text the Python path stores, cast to `json`: `jsonb` would rewrite them (keys sorted,
    -- 1e16 made an integer, -0.0 made 0.0). A `result` of None is the JSON value null, as the Python path writes it.
    UPDATE work_items AS w SET
        state = p_state,
        updated_at = p_now,
        state_rank = p_rank,
        fence_rank = p_rank,
        reason = COALESCE(p_reason, w.reason),
        result = CASE WHEN p_fields ? 'result' THEN (p_fields ->> 'result')::json ELSE w.result END,
        result_rank = CASE WHEN p_fields ? 'result' THEN p_rank ELSE w.result_rank END,
        delivery_branch = CASE WHEN p_fields ? 'delivery_branch' THEN p_fields ->> 'delivery_branch'
                          ELSE w.delivery_branch END,
        landed_commit = CASE WHEN p_fields ? 'landed_commit' THEN p_fields ->> 'landed_commit'
                        ELSE w.landed_commit END,
        mock = CASE WHEN p_fields ? 'mock' THEN (p_fields ->> 'mock')::boolean ELSE w.mock END,
        attempt_count = CASE WHEN p_fields ? 'attempt_count_at_least'
                             THEN GREATEST(w.attempt_count, (p_fields ->> 'attempt_count_at_least')::int)
                        ELSE w.attempt_count END
    WHERE w.id = p_wid;
    INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
    VALUES (p_wid, p_tenant, 'state_changed',
            COALESCE(p_event::json, json_build_object('state', p_state, 'reason', COALESCE(p_reason, ''),
                                                      'writer', p_writer)),
            p_rank, p_now);
    -- The webhook outbox: a statement of its own, so its snapshot is taken after every lock this write waited for
    -- (a webhook registered before the change commits is seen). No webhook, no row.
    INSERT INTO outbox (tenant_id, webhook_id, work_item_id, event_type, payload, status, attempts,
                        next_attempt_at, created_at, trace_context)
    SELECT p_tenant, h.id, p_wid, 'work_item.state_changed',
           (COALESCE(p_payload, jsonb_build_object('work_item_id', p_wid, 'state', p_state,
                                                   'reason', COALESCE(p_reason, '')))
            || jsonb_build_object('occurred_at', p_now))::json,
           'pending', 0, p_now, p_now, p_trace
    FROM webhooks h
    WHERE h.tenant_id = p_tenant AND h.active
      AND (NOT EXISTS (SELECT 1 FROM unnest(string_to_array(h.event_types, ',')) t WHERE t <> '')
           OR 'work_item.state_changed' = ANY (string_to_array(h.event_types, ',')))
    ORDER BY h.id;
END
$fn$;
"""

HAND_OFF = r"""
CREATE OR REPLACE FUNCTION crewwork_hand_off(
    p_tenant text, p_from text, p_now float8, p_max int, p_cap int, p_in_flight text[], p_trace text
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
-- FencingStore.hand_off, statement for statement (its docstring says why each step is there). The caller holds
-- the tenant lock.
DECLARE
    head_ids text[];
    head_created float8[];
    in_flight bigint;
    free bigint;
    owed bigint := 0;
    asked bigint := p_cap;
    n bigint;
    first_ids text[];
    handed jsonb := '[]'::jsonb;
    rec record;
    last_id text;
    last_created float8;
BEGIN
    SELECT array_agg(q.id ORDER BY q.created_at, q.id), array_agg(q.created_at ORDER BY q.created_at, q.id),
           (SELECT count(*) FROM work_items c WHERE c.tenant_id = p_tenant AND c.state = ANY (p_in_flight))
      INTO head_ids, head_created, in_flight
      FROM (SELECT w.id, w.created_at FROM work_items w
            WHERE w.tenant_id = p_tenant AND w.state = 'queued'
            ORDER BY w.created_at, w.id LIMIT p_cap) q;
    IF head_ids IS NULL THEN
        RETURN handed;
    END IF;
    free := p_max - in_flight;
    WHILE free > owed AND head_ids IS NOT NULL AND cardinality(head_ids) > 0 LOOP
        n := LEAST(cardinality(head_ids), free - owed);
        first_ids := head_ids[1:n];
        owed := owed + n;
        FOR rec IN
            SELECT w.id, w.fence_rank, w.workflow_id FROM work_items w
            WHERE w.id = ANY (first_ids) AND w.state = 'queued'
            ORDER BY array_position(first_ids, w.id::text)
            FOR UPDATE SKIP LOCKED
        LOOP
            -- Written at the handed item's own mark: nothing it scheduled is outranked.
            PERFORM crewwork_change_state(rec.id, p_tenant, rec.fence_rank, p_now, 'admitted',
                                          'admitted: a place freed', 'hand_off from ' || p_from,
                                          '{}'::jsonb, NULL, NULL, p_trace);
            handed := handed || jsonb_build_object('work_item_id', rec.id, 'workflow_id', rec.workflow_id);
            IF jsonb_array_length(handed) >= p_cap THEN
                RETURN handed;
            END IF;
        END LOOP;
        IF cardinality(head_ids) < asked OR free <= owed THEN
            EXIT;
        END IF;
        last_id := head_ids[n];
        last_created := head_created[n];
        asked := LEAST(p_cap, free - owed);
        SELECT array_agg(q.id ORDER BY q.created_at, q.id), array_agg(q.created_at ORDER BY q.created_at, q.id)
          INTO head_ids, head_created
          FROM (SELECT w.id, w.created_at FROM work_items w
                WHERE w.tenant_id = p_tenant AND w.state = 'queued'
                  AND (w.created_at, w.id) > (last_created, last_id)
                ORDER BY w.created_at, w.id LIMIT asked) q;
    END LOOP;
    RETURN handed;
END
$fn$;
"""

FENCED_WRITE = r"""
CREATE OR REPLACE FUNCTION crewwork_fenced_write(
    p_wid text, p_tenant text, p_rank bigint, p_writer text, p_ops jsonb, p_terminal text[], p_in_flight text[],
    p_hand_off jsonb, p_trace text,
    p_art_id text, p_art_name text, p_art_type text, p_art_size bigint, p_art_sha text, p_art bytea
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
-- FencingStore.fenced_write with its operations (`p_ops`, in order): 'state' (a state change), 'event', 'artifact'
-- (the one artifact of the p_art_* arguments), 'attempt' (an attempt record and its event), 'fingerprints' and
-- 'admit'. What an operation yields is a key of `results`: 'fingerprints', 'admission', and 'handed' (the hand-off).
DECLARE
    v_state text;
    v_mark bigint;
    v_now float8;
    v_created float8;
    op jsonb;
    results jsonb := '{}'::jsonb;
    raised boolean := false;
    handing boolean := false;
    rejected text;
    in_flight bigint;
    ahead bigint;
    lim bigint;
    why text;
BEGIN
    SELECT w.state, w.fence_rank, extract(epoch from clock_timestamp())::float8, w.created_at
      INTO v_state, v_mark, v_now, v_created
      FROM work_items w WHERE w.id = p_wid FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('ok', false, 'missing', true);
    END IF;
    IF p_rank < v_mark OR v_state = ANY (p_terminal) THEN
        -- json text, not jsonb: the keys in the Python path's order.
        rejected := format('"writer": %s, "presented": {"step": %s, "attempt": %s}, "current": {"step": %s, '
                           '"attempt": %s}', to_json(p_writer), p_rank / 1000000, p_rank % 1000000, v_mark / 1000000,
                           v_mark % 1000000);
        IF p_rank < v_mark THEN
            INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
            VALUES (p_wid, p_tenant, 'stale_write_rejected', ('{' || rejected || '}')::json, p_rank, v_now);
            RETURN jsonb_build_object('ok', false, 'mark', v_mark, 'state', v_state);
        END IF;
        -- A zombie attempt that only wakes after its item finished must not reopen it.
        INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
        VALUES (p_wid, p_tenant, 'write_after_terminal_rejected',
                ('{' || rejected || ', "state": ' || to_json(v_state) || '}')::json, p_rank, v_now);
        RETURN jsonb_build_object('ok', false, 'closed', true, 'mark', v_mark, 'state', v_state);
    END IF;
    -- Only an item that held a place hands it on, or a queued one leaving the queue. The tenant lock comes before
    -- the item's own change, so that change is not followed by a wait of unbounded length before the commit.
    IF p_hand_off IS NOT NULL AND (v_state = ANY (p_in_flight) OR v_state = 'queued') THEN
        handing := true;
        PERFORM 1 FROM tenants t WHERE t.id = p_tenant FOR NO KEY UPDATE;
    END IF;
    FOR op IN SELECT value FROM jsonb_array_elements(p_ops) LOOP
        CASE op ->> 'op'
        WHEN 'state' THEN
            PERFORM crewwork_change_state(p_wid, p_tenant, p_rank, v_now, op ->> 'state', op ->> 'reason', p_writer,
                                          COALESCE(op -> 'fields', '{}'::jsonb), op ->> 'event', op -> 'payload',
                                          p_trace);
            raised := true;
        WHEN 'event' THEN
            INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
            VALUES (p_wid, p_tenant, op ->> 'type', (op ->> 'data')::json, p_rank, v_now);
        WHEN 'artifact' THEN
            INSERT INTO artifacts (id, work_item_id, tenant_id, name, content_type, size, sha256, content, created_at)
            VALUES (p_art_id, p_wid, p_tenant, p_art_name, p_art_type, p_art_size, p_art_sha, p_art, v_now);
        WHEN 'attempt' THEN
            INSERT INTO attempts (work_item_id, number, rank, verdict, reason, cause, fingerprint, agent, validation,
                                  created_at, updated_at)
            VALUES (p_wid, (op ->> 'number')::int, p_rank, op ->> 'verdict', op ->> 'reason', op ->> 'cause',
                    op ->> 'fingerprint',
                    (op ->> 'agent')::json, (op ->> 'validation')::json,
                    v_now, v_now)
            ON CONFLICT (work_item_id, number) DO UPDATE SET
                rank = EXCLUDED.rank, verdict = EXCLUDED.verdict, reason = EXCLUDED.reason, cause = EXCLUDED.cause,
                fingerprint = EXCLUDED.fingerprint, agent = EXCLUDED.agent, validation = EXCLUDED.validation,
                updated_at = EXCLUDED.updated_at;
            INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
            VALUES (p_wid, p_tenant, 'attempt_recorded', (op ->> 'event')::json, p_rank, v_now);
            IF (op ->> 'count')::boolean THEN
                UPDATE work_items SET attempt_count = GREATEST(attempt_count, (op ->> 'number')::int),
                                      updated_at = v_now
                WHERE id = p_wid;
            END IF;
        WHEN 'fingerprints' THEN
            results := results || jsonb_build_object('fingerprints', COALESCE(
                (SELECT jsonb_agg(CASE WHEN a.verdict <> 'passed' THEN to_jsonb(a.fingerprint) ELSE 'null'::jsonb END
                                  ORDER BY a.number)
                 FROM attempts a WHERE a.work_item_id = p_wid),
                '[]'::jsonb));
        WHEN 'admit' THEN
            -- FencingStore.admit: a waiting item is admitted or queued first come, first served.
            IF v_state NOT IN ('submitted', 'queued') THEN
                results := results || jsonb_build_object('admission', jsonb_build_object(
                    'admitted', true,
                    'fingerprints', COALESCE(
                        (SELECT jsonb_agg(CASE WHEN a.verdict <> 'passed' THEN to_jsonb(a.fingerprint)
                                          ELSE 'null'::jsonb END ORDER BY a.number)
                         FROM attempts a WHERE a.work_item_id = p_wid),
                        '[]'::jsonb)));
                CONTINUE;
            END IF;
            in_flight := 0;
            ahead := 0;
            lim := (op ->> 'max')::bigint;
            IF lim IS NOT NULL THEN
                -- Serialise the tenant's admissions; the counts are a statement of their own, so that they see
                -- everything committed before the lock was granted.
                PERFORM 1 FROM tenants t WHERE t.id = p_tenant FOR NO KEY UPDATE;
                SELECT (SELECT count(*) FROM work_items c
                        WHERE c.tenant_id = p_tenant AND c.state = ANY (p_in_flight)),
                       (SELECT count(*) FROM work_items c
                        WHERE c.tenant_id = p_tenant AND c.state = 'queued'
                          AND (c.created_at, c.id) < (v_created, p_wid))
                  INTO in_flight, ahead;
                IF in_flight + ahead >= lim THEN
                    why := format('queued: %s of the tenant''s %s in-flight places taken, %s ahead', in_flight, lim,
                                  ahead);
                    IF v_state <> 'queued' THEN
                        PERFORM crewwork_change_state(p_wid, p_tenant, p_rank, v_now, 'queued', why,
                                                      COALESCE(op ->> 'writer', p_writer),
                                                      '{}'::jsonb, NULL, NULL, p_trace);
                        raised := true;
                    END IF;
                    results := results || jsonb_build_object('admission', jsonb_build_object(
                        'admitted', false, 'queued_position', ahead + 1, 'in_flight', in_flight));
                    CONTINUE;
                END IF;
            END IF;
            PERFORM crewwork_change_state(p_wid, p_tenant, p_rank, v_now, 'admitted', 'admitted',
                                          COALESCE(op ->> 'writer', p_writer),
                                          '{}'::jsonb, NULL, NULL, p_trace);
            raised := true;
            results := results || jsonb_build_object('admission', jsonb_build_object(
                'admitted', true, 'in_flight', in_flight + 1, 'fingerprints', '[]'::jsonb));
        ELSE
            RAISE EXCEPTION 'crewwork_fenced_write: unknown operation %', op ->> 'op';
        END CASE;
    END LOOP;
    IF handing THEN
        results := results || jsonb_build_object('handed', crewwork_hand_off(
            p_tenant, p_wid, v_now, (p_hand_off ->> 'max')::int, (p_hand_off ->> 'cap')::int, p_in_flight, p_trace));
    END IF;
    IF p_rank > v_mark AND NOT raised THEN
        UPDATE work_items SET fence_rank = p_rank WHERE id = p_wid;
    END IF;
    RETURN jsonb_build_object('ok', true, 'state', v_state, 'mark', v_mark, 'now', v_now, 'results', results);
END
$fn$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(CHANGE_STATE)
    op.execute(HAND_OFF)
    op.execute(FENCED_WRITE)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "DROP FUNCTION IF EXISTS crewwork_fenced_write(text, text, bigint, text, jsonb, text[], text[], jsonb, text, "
        "text, text, text, bigint, text, bytea)"
    )
    op.execute("DROP FUNCTION IF EXISTS crewwork_hand_off(text, text, float8, int, int, text[], text)")
    op.execute(
        "DROP FUNCTION IF EXISTS crewwork_change_state(text, text, bigint, float8, text, text, text, jsonb, text, "
        "jsonb, text)"
    )
