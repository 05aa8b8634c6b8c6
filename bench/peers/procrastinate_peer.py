"""Procrastinate (a PostgreSQL job queue) running the peer lifecycle, as its documentation recommends: an `App` on a
`PsycopgConnector`, an async task, `defer_async` to enqueue, `run_worker_async` to work. Claiming is Procrastinate's
`SELECT ... FOR UPDATE SKIP LOCKED` fetch; the lease is the job's `doing` status kept alive by worker heartbeats;
recovery of a dead worker's job is the documented `get_stalled_jobs` + `retry_job`.

Run as a worker process (for the zombie scenario): `python bench/peers/procrastinate_peer.py worker NAME DB`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import procrastinate
from psycopg_pool import AsyncConnectionPool

from bench.peers.common import APPEND_EVENT, conninfo, write_result

DB = os.environ.get("PEER_DB", "postgres")
WORKER = os.environ.get("PEER_WORKER", "bench")
STALL_ITEM = os.environ.get("PEER_STALL_ITEM", "")
STALL_S = float(os.environ.get("PEER_STALL_S", "0"))
DELAY_S = float(os.environ.get("PEER_DELAY_S", "0"))

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo(DB)))
_pool: AsyncConnectionPool | None = None


async def pool() -> AsyncConnectionPool:
    global _pool
    if _pool is None:
        _pool = AsyncConnectionPool(conninfo(DB), min_size=1, max_size=10, open=False)
        await _pool.open()
    return _pool


@app.task(name="peer_process", queue="peer", pass_context=True)
async def peer_process(context: procrastinate.JobContext, item_id: str) -> None:
    job = context.job
    writer = f"{WORKER}/job{job.id}/attempt{job.attempts}"
    async with (await pool()).connection() as conn:
        await conn.execute(APPEND_EVENT, {"id": item_id, "type": "started", "data": f'{{"writer": "{writer}"}}'})
        await conn.commit()
        if item_id == STALL_ITEM and STALL_S:
            await asyncio.to_thread(time.sleep, STALL_S)  # the zombie: blocked, then carries on
        if DELAY_S:
            await asyncio.sleep(DELAY_S)  # execute: the job (a no-op, or the load test's 100 ms mock agent)
        await write_result(conn, item_id, writer)


async def run_worker(name: str, concurrency: int = int(os.environ.get("PEER_CONCURRENCY", "1"))) -> None:
    async with app.open_async():
        await app.run_worker_async(
            queues=["peer"],
            name=name,
            concurrency=concurrency,
            update_heartbeat_interval=1.0,
            stalled_worker_timeout=3.0,
            install_signal_handlers=True,
        )


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        asyncio.run(run_worker(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])


__all__: list[Any] = ["app", "peer_process", "run_worker"]
