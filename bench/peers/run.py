"""crewwork against its peers on one lifecycle (claim, lease, execute a no-op job, result write, event), on the same
PostgreSQL, in one run: DBOS Transact (durable workflows on PostgreSQL) and Procrastinate (a PostgreSQL job queue).

1. Throughput and latency: N items each, all enqueued at once, the same concurrency (10 at a time).
2. The zombie scenario, run against each for real: an attempt blocks past the point where the system gives up on it
   (its process SIGSTOPped past the heartbeat / the executor presumed dead), the system's own recovery runs a newer
   attempt which writes its result, then the stale attempt wakes and writes. Reported: whose result is stored.

    .venv/bin/python bench/peers/run.py [--quick] [--items 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.deps import require

# Before anything else (the peers are imported only after crewwork's own run, minutes in).
if __name__ == "__main__":
    require("bench/peers/run.py", ["psycopg", "psycopg_pool", "procrastinate", "dbos"])

from bench.harness import (
    bench_settings,
    dev_server,
    in_process_pools,
    pg_database,
    summary,
    task_spec,
    write_results,
)
from bench.overhead import crew_round
from bench.peers import common

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PY = sys.executable


async def wait_for(probe: Any, timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        await asyncio.sleep(every_s)
    return False


def events_of(db: str, item: str, type_: str) -> list[Any]:
    return [d for t, d in common.result_of(db, item)["events"] if t == type_]


# ------------------------------------------------------------------------------------------------ crewwork


async def crewwork_side(root: Path, n: int, zombie: bool) -> dict[str, Any]:
    from sqlalchemy import select

    from crewwork.models import WorkItemSpec
    from crewwork.store.tables import Event
    from tests.invariants import check_invariants

    out: dict[str, Any] = {}
    with pg_database("crewwork_peers") as (url, _db), dev_server(root / "temporal") as server:
        settings = bench_settings(root / "data", server, url, agent_concurrency=10, control_concurrency=100)
        async with in_process_pools(settings, ("control", "agent")) as (service, store, tenant):
            await crew_round(service, tenant, [task_spec() for _ in range(5)])
            out["throughput"] = await crew_round(service, tenant, [task_spec() for _ in range(n)])
            if zombie:
                # Attempt 1 stops heartbeating and renewing and blocks 15 s (past the 10 s heartbeat timeout);
                # Temporal retries it, attempt 2 writes the result; then attempt 1 wakes and tries its writes.
                spec = task_spec(agent={"name": "scripted", "config": {"output": {"by": "x"}, "stall_s": 15}})
                sub = await service.submit(tenant, WorkItemSpec.model_validate(spec))
                wid = sub.row.id
                await service.client.get_workflow_handle(sub.row.workflow_id).result()
                deadline = time.monotonic() + 40
                stale: list[Event] = []
                while time.monotonic() < deadline and not stale:
                    async with store.session() as s:
                        stale = list(
                            (
                                await s.scalars(
                                    select(Event).where(Event.work_item_id == wid, Event.type == "stale_write_rejected")
                                )
                            ).all()
                        )
                    await asyncio.sleep(0.5)
                row = await store.get_work_item(wid)
                assert row is not None
                report = await check_invariants(store, [wid])
                out["zombie"] = {
                    "final_state": row.state,
                    "stale_writes_rejected": len(stale),
                    "rejected": [e.data for e in stale],
                    "result_rank_is_newest": report.results["fence_mark"].ok and report.results["monotonic_writes"].ok,
                    "overwrote": not (report.results["fence_mark"].ok and report.results["monotonic_writes"].ok),
                    "invariants_ok": report.ok,
                }
    return out


# ------------------------------------------------------------------------------------------------ procrastinate


async def procrastinate_side(db: str, n: int, zombie: bool) -> dict[str, Any]:
    os.environ["PEER_DB"] = db
    from bench.peers import procrastinate_peer as peer

    out: dict[str, Any] = {}
    async with peer.app.open_async():
        await peer.app.schema_manager.apply_schema_async()
        common.setup(db)
        ids = [f"pq-{uuid.uuid4().hex[:10]}" for _ in range(n)]
        common.insert_items(db, ids)
        worker = asyncio.create_task(
            peer.app.run_worker_async(queues=["peer"], concurrency=10, install_signal_handlers=False, name="bench")
        )
        started = time.time()
        for i in ids:
            await peer.peer_process.defer_async(item_id=i)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            f = common.figures(db, ids, started)
            if f["done"] == n:
                break
            await asyncio.sleep(0.2)
        out["throughput"] = f
        worker.cancel()
        with_suppress = asyncio.gather(worker, return_exceptions=True)
        await with_suppress
        if zombie:
            out["zombie"] = await procrastinate_zombie(db, peer)
    return out


async def procrastinate_zombie(db: str, peer: Any) -> dict[str, Any]:
    item = f"pq-zombie-{uuid.uuid4().hex[:6]}"
    common.insert_items(db, [item])
    env = {**os.environ, "PEER_DB": db, "PEER_WORKER": "A", "PEER_STALL_ITEM": item, "PEER_STALL_S": "12"}
    a = subprocess.Popen([PY, "-m", "bench.peers.procrastinate_peer", "worker", "A"], env=env, cwd=ROOT)
    try:
        await peer.peer_process.defer_async(item_id=item)
        if not await wait_for(lambda: events_of(db, item, "started"), 60):
            return {"error": "worker A never started the job"}
        a.send_signal(signal.SIGSTOP)  # A's heartbeat stops: from outside, A is dead
        await asyncio.sleep(5)
        # The documented recovery of a dead worker's jobs.
        stalled = list(await peer.app.job_manager.get_stalled_jobs(seconds_since_heartbeat=3))
        for job in stalled:
            await peer.app.job_manager.retry_job(job)
        worker = asyncio.create_task(
            peer.app.run_worker_async(queues=["peer"], concurrency=2, install_signal_handlers=False, name="B")
        )
        ok = await wait_for(lambda: events_of(db, item, "result_written"), 60)
        after_new = common.result_of(db, item)["result_writer"]
        a.send_signal(signal.SIGCONT)
        await wait_for(lambda: len(events_of(db, item, "result_written")) >= 2, 30)
        await asyncio.sleep(1)
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        final = common.result_of(db, item)
        return {
            "stalled_jobs_retried": len(stalled),
            "newer_attempt_wrote": ok,
            "result_after_newer_attempt": after_new,
            "final_result_writer": final["result_writer"],
            "result_writes": len([e for e in final["events"] if e[0] == "result_written"]),
            "overwrote": final["result_writer"] != after_new,
        }
    finally:
        a.send_signal(signal.SIGCONT)
        a.terminate()
        a.wait(10)


# ------------------------------------------------------------------------------------------------ DBOS


def dbos_side(db: str, n: int, zombie: bool) -> dict[str, Any]:
    os.environ["PEER_DB"] = db
    from dbos import DBOS

    from bench.peers import dbos_peer as peer

    common.setup(db)
    peer.launch(db, "bench", concurrency=10)  # DBOS is launched outside any event loop
    try:
        return asyncio.run(_dbos_runs(db, n, zombie, peer))
    finally:
        DBOS.destroy()


async def _dbos_runs(db: str, n: int, zombie: bool, peer: Any) -> dict[str, Any]:
    from dbos import DBOS

    out: dict[str, Any] = {}
    ids = [f"db-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    common.insert_items(db, ids)
    started = time.time()
    handles = [await DBOS.enqueue_workflow_async(peer.QUEUE, peer.peer_process, i) for i in ids]
    await asyncio.gather(*(h.get_result() for h in handles))
    out["throughput"] = common.figures(db, ids, started)
    if zombie:
        out["zombie"] = await dbos_zombie(db, peer)
    return out


async def dbos_zombie(db: str, peer: Any) -> dict[str, Any]:
    from dbos import DBOS

    item = f"db-zombie-{uuid.uuid4().hex[:6]}"
    common.insert_items(db, [item])
    env = {**os.environ, "PEER_DB": db, "PEER_STALL_ITEM": item, "PEER_STALL_S": "10"}
    a = subprocess.Popen(
        [PY, "-m", "bench.peers.dbos_peer", "start", "zombie-a", db, item],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        if not await wait_for(lambda: events_of(db, item, "started"), 90):
            return {"error": "executor A never started the workflow"}
        a.send_signal(signal.SIGSTOP)  # executor A is presumed dead
        # What a restarted executor or DBOS Conductor does for a dead executor's pending workflows.
        handles = DBOS._recover_pending_workflows(["zombie-a"])
        results = [await asyncio.to_thread(h.get_result) for h in handles]
        after_new = common.result_of(db, item)["result_writer"]
        a.send_signal(signal.SIGCONT)
        try:
            a_out, _ = a.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            a.kill()
            a_out, _ = a.communicate()
        final = common.result_of(db, item)
        return {
            "recovered_workflows": len(handles),
            "recovered_results": results,
            "result_after_newer_attempt": after_new,
            "final_result_writer": final["result_writer"],
            "result_writes": len([e for e in final["events"] if e[0] == "result_written"]),
            "overwrote": final["result_writer"] != after_new,
            "zombie_process_said": [ln for ln in (a_out or "").splitlines() if "result" in ln or "zombie" in ln][-3:],
        }
    finally:
        if a.poll() is None:
            a.send_signal(signal.SIGCONT)
            a.kill()


# ------------------------------------------------------------------------------------------------ main


def tp(name: str, items: int, wall: float, lat: list[float] | dict[str, Any]) -> dict[str, Any]:
    s = lat if isinstance(lat, dict) else summary(lat)
    return {"system": name, "items": items, "items_per_s": items / wall if wall else 0.0, "latency_s": s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="30 items each")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--no-zombie", action="store_true")
    args = ap.parse_args()
    n = 30 if args.quick else args.items
    zombie = not args.no_zombie
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="crewwork-peers-") as tmp:
        res["crewwork"] = asyncio.run(crewwork_side(Path(tmp), n, zombie))
        print("crewwork done", flush=True)
    with pg_database("peer_procrastinate", migrate=False) as (_u, db):
        res["procrastinate"] = asyncio.run(procrastinate_side(db, n, zombie))
        print("procrastinate done", flush=True)
    with pg_database("peer_dbos", migrate=False) as (_u, db):
        res["dbos"] = dbos_side(db, n, zombie)
        print("dbos done", flush=True)
    c = res["crewwork"]["throughput"]
    rows = [tp("crewwork (Temporal + fenced store)", c["items"], c["wall_s"], c["latency_s"])]
    for name, key in (("Procrastinate", "procrastinate"), ("DBOS Transact", "dbos")):
        t = res[key]["throughput"]
        rows.append(tp(name, t["done"], t["wall_s"], t["latency"]))
    res["table"] = rows
    from bench.report import peers as render

    print()
    print(render(res))
    write_results("peers", res)


if __name__ == "__main__":
    main()
