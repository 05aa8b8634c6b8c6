"""What every peer implementation shares: the application's own tables (the item and its event log) on the same
PostgreSQL, and the figures taken from them.

The lifecycle each peer runs, in its own idiom: claim a job (the peer's queue), hold it (the peer's lease or
heartbeat), execute a no-op job, write the result, append an event. The result write is the one the peer's
documentation leads to; where the peer has no fencing, the write is a plain UPDATE of the item, which is exactly
what the zombie scenario probes.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

SCHEMA = """
CREATE TABLE IF NOT EXISTS peer_items (
    id text PRIMARY KEY,
    state text NOT NULL DEFAULT 'submitted',
    result jsonb,
    result_writer text,
    submitted_at double precision NOT NULL,
    finished_at double precision
);
CREATE TABLE IF NOT EXISTS peer_events (
    id bigserial PRIMARY KEY,
    item_id text NOT NULL,
    type text NOT NULL,
    data jsonb,
    created_at double precision NOT NULL DEFAULT extract(epoch from clock_timestamp())
);
CREATE INDEX IF NOT EXISTS peer_events_item ON peer_events (item_id, id);
"""

WRITE_RESULT = """
UPDATE peer_items SET state = 'succeeded', result = %(result)s, result_writer = %(writer)s,
       finished_at = extract(epoch from clock_timestamp())
 WHERE id = %(id)s
"""
APPEND_EVENT = "INSERT INTO peer_events (item_id, type, data) VALUES (%(id)s, %(type)s, %(data)s)"


def conninfo(db: str) -> str:
    return f"host=127.0.0.1 port=5432 user=postgres dbname={db}"


def setup(db: str) -> None:
    with psycopg.connect(conninfo(db), autocommit=True) as c:
        c.execute(SCHEMA)


def insert_items(db: str, ids: list[str]) -> None:
    with psycopg.connect(conninfo(db), autocommit=True) as c, c.cursor() as cur:
        cur.executemany(
            "INSERT INTO peer_items (id, submitted_at) VALUES (%s, extract(epoch from clock_timestamp()))",
            [(i,) for i in ids],
        )


async def write_result(conn: psycopg.AsyncConnection[Any], item_id: str, writer: str) -> None:
    """The result write and its event, in one transaction (what each peer's docs recommend for app data)."""
    from psycopg.types.json import Jsonb

    async with conn.transaction():
        await conn.execute(WRITE_RESULT, {"id": item_id, "result": Jsonb({"ok": True}), "writer": writer})
        await conn.execute(APPEND_EVENT, {"id": item_id, "type": "result_written", "data": Jsonb({"writer": writer})})


def figures(db: str, ids: list[str], started: float) -> dict[str, Any]:
    with psycopg.connect(conninfo(db)) as c:
        rows = c.execute(
            "SELECT submitted_at, finished_at FROM peer_items WHERE id = ANY(%s) AND finished_at IS NOT NULL",
            (ids,),
        ).fetchall()
    lat = [f - s for s, f in rows]
    end = max((f for _s, f in rows), default=time.time())
    return {"done": len(rows), "latency": lat, "wall_s": end - started}


def result_of(db: str, item_id: str) -> dict[str, Any]:
    with psycopg.connect(conninfo(db)) as c:
        state, writer = c.execute("SELECT state, result_writer FROM peer_items WHERE id = %s", (item_id,)).fetchone()  # type: ignore[misc]
        events = c.execute("SELECT type, data FROM peer_events WHERE item_id = %s ORDER BY id", (item_id,)).fetchall()
    return {"state": state, "result_writer": writer, "events": [[t, d] for t, d in events]}
