"""DBOS Transact running the peer lifecycle, as its documentation recommends: `@DBOS.workflow()` orchestrating
`@DBOS.step()`s (each step's output checkpointed in the system database), started through a registered queue.
Claiming is DBOS's queue dequeue; the "lease" is the executor that owns a pending workflow; recovery of a dead
executor's workflows is `recover_pending_workflows` (what DBOS Conductor / a restarted executor runs).

Run as an executor process (for the zombie scenario): `python bench/peers/dbos_peer.py start EXECUTOR DB ITEM`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg
from dbos import DBOS, DBOSConfig

from bench.peers.common import APPEND_EVENT, conninfo, write_result

STALL_ITEM = os.environ.get("PEER_STALL_ITEM", "")
STALL_S = float(os.environ.get("PEER_STALL_S", "0"))
QUEUE = "peer"


def launch(db: str, executor_id: str, concurrency: int = 10) -> None:
    config: DBOSConfig = {
        "name": "crewwork-peer",
        "system_database_url": f"postgresql://postgres@127.0.0.1:5432/{db}",
        "executor_id": executor_id,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=0.1)
    os.environ["PEER_DB"] = db


@DBOS.step()
async def execute(item_id: str) -> None:
    """The no-op job."""
    return None


@DBOS.step()
async def record(item_id: str) -> str:
    writer = f"{DBOS.executor_id}/{DBOS.workflow_id}"
    async with await psycopg.AsyncConnection.connect(conninfo(os.environ["PEER_DB"])) as conn:
        await conn.execute(APPEND_EVENT, {"id": item_id, "type": "started", "data": f'{{"writer": "{writer}"}}'})
        await conn.commit()
        if item_id == STALL_ITEM and STALL_S:
            await asyncio.to_thread(time.sleep, STALL_S)  # the zombie: blocked, then carries on
        await write_result(conn, item_id, writer)
    return writer


@DBOS.workflow()
async def peer_process(item_id: str) -> str:
    await execute(item_id)
    return await record(item_id)


def main(argv: list[str]) -> None:
    if argv[:1] == ["start"]:
        _, executor, db, item = argv
        launch(db, executor)

        async def go() -> None:
            from dbos import SetWorkflowID

            with SetWorkflowID(f"wf-{item}"):
                h = await DBOS.start_workflow_async(peer_process, item)
            try:
                print("result", await h.get_result(), flush=True)
            except Exception as exc:  # what the zombie meets when it finally tries to checkpoint
                print("zombie error", type(exc).__name__, str(exc)[:300], flush=True)

        asyncio.run(go())
        DBOS.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
