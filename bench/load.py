"""The agent-task load test: 100 `task` work items whose mock agent takes 100 ms, submitted by 12 concurrent HTTP
clients through the real API, against 1 and then 2 agent-pool processes.

Everything is a real process: the embedded stack (crewwork.stack.Stack) runs the Temporal dev server, the API
(uvicorn) and `crewwork worker --pool control|agent` subprocesses on a throwaway PostgreSQL database. Every store
write is fenced as always.

Figures per configuration:
- tasks/s: items over the wall time from the first submit to the last terminal state (database clock);
- submit latency: the HTTP POST round trip;
- submit-to-result: from the client starting its POST to the item's terminal state change (database clock, same host);
- queue wait: from the client starting its POST to the agent activity starting (Temporal history), i.e. the time
  a task waited before a worker picked it up (the figure a job queue calls "queue wait"); also Temporal's own
  scheduled-to-started of that activity.

Reference (issue 9): a PostgreSQL SKIP LOCKED task platform on this load and these machines did about 8 tasks/s with
1 worker and 14 with 2, submit-to-result p50 about 4.6 s and 2.4 s.

    .venv/bin/python bench/load.py [--quick] [--items 100] [--clients 12] [--agents 1,2] [--slots 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from sqlalchemy import select

from bench.harness import pg_database, proc_cpu_s, rss_mb, summary, task_spec, write_results
from crewwork.models import WorkItemState
from crewwork.stack import Stack
from crewwork.store.store import Store
from crewwork.store.tables import Event, WorkItem
from crewwork.temporal.devserver import free_port

REFERENCE = {
    1: {"tasks_per_s": 8.0, "submit_to_result_p50_s": 4.6},
    2: {"tasks_per_s": 14.0, "submit_to_result_p50_s": 2.4},
}
TERMINAL = [s.value for s in WorkItemState if s.terminal]


async def drive(stack: Stack, url: str, items: int, clients: int, timeout_s: float) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(items):
        queue.put_nowait(i)
    submitted: dict[str, float] = {}
    submit_lat: list[float] = []
    errors: list[str] = []

    async def client() -> None:
        async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=60) as http:
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t_wall, t0 = time.time(), time.perf_counter()
                r = await http.post("/v1/work-items", json=task_spec(delay_s=0.1))
                submit_lat.append(time.perf_counter() - t0)
                if r.status_code >= 300:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    continue
                submitted[r.json()["id"]] = t_wall

    store = Store(url)
    start = time.time()
    await asyncio.gather(*(client() for _ in range(clients)))
    deadline = time.monotonic() + timeout_s
    done: dict[str, float] = {}
    while time.monotonic() < deadline:
        async with store.session() as s:
            rows = (
                await s.execute(
                    select(WorkItem.id, WorkItem.state, WorkItem.updated_at).where(
                        WorkItem.id.in_(list(submitted)), WorkItem.state.in_(TERMINAL)
                    )
                )
            ).all()
        if len(rows) == len(submitted):
            break
        await asyncio.sleep(0.2)
    states: dict[str, int] = {}
    async with store.session() as s:
        all_rows = (await s.execute(select(WorkItem.id, WorkItem.state).where(WorkItem.id.in_(list(submitted))))).all()
        for _wid, state in all_rows:
            states[state] = states.get(state, 0) + 1
        # The terminal state change's time (database clock) is when the result was stored.
        finals = (
            await s.execute(
                select(Event.work_item_id, Event.created_at, Event.data).where(
                    Event.work_item_id.in_(list(submitted)), Event.type == "state_changed"
                )
            )
        ).all()
    await store.close()
    agent_started: dict[str, float] = {}
    for wid, created_at, data in finals:
        if data.get("state") in TERMINAL:
            done[wid] = max(done.get(wid, 0.0), float(created_at))
        if data.get("state") == "running" and "activity_attempt" in data:
            agent_started[wid] = min(agent_started.get(wid, float("inf")), float(created_at))
    s2r = [done[w] - submitted[w] for w in done]
    qwait = [agent_started[w] - submitted[w] for w in agent_started if w in submitted]
    end = max(done.values()) if done else time.time()
    return {
        "items": items,
        "clients": clients,
        "states": states,
        "errors": errors[:5],
        "wall_s": end - start,
        "tasks_per_s": len(done) / (end - start),
        "submit_latency_s": summary(submit_lat),
        "submit_to_result_s": summary(s2r),
        "queue_wait_s": summary(qwait),
    }


def load_stack(
    data_dir: Path, url: str, agents: int, slots: int, control: int = 1, env: dict[str, str] | None = None
) -> Stack:
    """The load test's stack: the API, `control` control processes and `agents` agent processes of `slots` each, on a
    throwaway Temporal dev server and the given database (`env`: more settings for every process)."""
    return Stack(
        data_dir,
        temporal_port=free_port(),
        ui_port=free_port(),
        api_port=free_port(),
        database_url=url,
        pool_counts={"control": control, "agent": agents, "validate": 0},
        ui=False,
        extra_env={
            "CREWWORK_TASK_QUEUE_PREFIX": f"load{uuid.uuid4().hex[:6]}",
            "CREWWORK_AGENT_CONCURRENCY": str(slots),
            # The reference had no rate limit: 100 submits from one key must not be throttled.
            "CREWWORK_API_RATE_PER_S": "10000",
            "CREWWORK_API_RATE_BURST": "10000",
            "CREWWORK_LOG_LEVEL": "WARNING",
            **(env or {}),
        },
    )


def run_config(url: str, agents: int, slots: int, items: int, clients: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="crewwork-load-") as tmp:
        stack = load_stack(Path(tmp), url, agents, slots)
        stack.start()
        try:
            time.sleep(2.0)  # pools connect and start polling
            # Warm-up: a few items so imports, connections and first workflow tasks are out of the way.
            asyncio.run(drive(stack, url, 4, 4, 60))
            rss_before = {p.name: rss_mb(p.proc.pid) for p in stack.processes if p.proc}
            cpu_before = {p.name: proc_cpu_s(p.proc.pid) for p in stack.processes if p.proc}
            tserver = stack.temporal.proc.pid if stack.temporal and stack.temporal.proc else 0
            cpu_before["temporal"] = proc_cpu_s(tserver)
            out = asyncio.run(drive(stack, url, items, clients, 300))
            # CPU seconds each process spent on the run: where the time goes.
            out["cpu_s"] = {
                p.name: proc_cpu_s(p.proc.pid) - cpu_before.get(p.name, 0.0) for p in stack.processes if p.proc
            }
            out["cpu_s"]["temporal"] = proc_cpu_s(tserver) - cpu_before["temporal"]
            out["rss_mb_after"] = {p.name: rss_mb(p.proc.pid) for p in stack.processes if p.proc}
            out["rss_mb_idle"] = rss_before
        finally:
            stack.stop()
    out.update({"agent_processes": agents, "agent_slots_per_process": slots})
    return out


def procrastinate_reference(
    worker_counts: list[int], items: int, clients: int, concurrencies: list[int]
) -> list[dict[str, Any]]:
    """The same load on Procrastinate (a PostgreSQL SKIP LOCKED job queue), in this run, on this machine: `workers`
    worker processes of `concurrency` jobs each, jobs deferred by `clients` concurrent coroutines (no HTTP in
    front). One database for every configuration: the peer's app is configured once, at import."""
    import os
    import subprocess

    import psycopg

    from bench.peers import common

    root = Path(__file__).resolve().parents[1]
    with pg_database("load_procrastinate", migrate=False) as (_u, db):
        os.environ["PEER_DB"] = db
        from bench.peers import procrastinate_peer as peer

        schema_ready: list[bool] = []

        async def go(workers: int, concurrency: int) -> dict[str, Any]:
            async with peer.app.open_async():
                if not schema_ready:
                    await peer.app.schema_manager.apply_schema_async()
                    common.setup(db)
                    schema_ready.append(True)
                env = {**os.environ, "PEER_DB": db, "PEER_DELAY_S": "0.1", "PEER_CONCURRENCY": str(concurrency)}
                procs = [
                    subprocess.Popen(
                        [sys.executable, "-m", "bench.peers.procrastinate_peer", "worker", f"w{i}"], env=env, cwd=root
                    )
                    for i in range(workers)
                ]
                try:
                    await asyncio.sleep(3)
                    ids = [f"ld-{uuid.uuid4().hex[:10]}" for _ in range(items)]
                    q: asyncio.Queue[str] = asyncio.Queue()
                    for i in ids:
                        q.put_nowait(i)
                    lat: list[float] = []

                    async def client() -> None:
                        while not q.empty():
                            i = q.get_nowait()
                            t0 = time.perf_counter()
                            common.insert_items(db, [i])
                            await peer.peer_process.defer_async(item_id=i)
                            lat.append(time.perf_counter() - t0)

                    start = time.time()
                    await asyncio.gather(*(client() for _ in range(clients)))
                    deadline = time.monotonic() + 300
                    while time.monotonic() < deadline and common.figures(db, ids, start)["done"] < items:
                        await asyncio.sleep(0.2)
                    f = common.figures(db, ids, start)
                    with psycopg.connect(common.conninfo(db)) as c:
                        waits = [
                            r[0]
                            for r in c.execute(
                                "SELECT min(e.created_at) - i.submitted_at FROM peer_items i JOIN peer_events e "
                                "ON e.item_id = i.id AND e.type = 'started' GROUP BY i.id, i.submitted_at"
                            ).fetchall()
                        ]
                    return {
                        "system": "procrastinate",
                        "agent_processes": workers,
                        "agent_slots_per_process": concurrency,
                        "tasks_per_s": f["done"] / f["wall_s"],
                        "submit_latency_s": summary(lat),
                        "submit_to_result_s": summary(f["latency"]),
                        "queue_wait_s": summary(waits),
                        "states": {"succeeded": f["done"]},
                    }
                finally:
                    for p in procs:
                        p.terminate()
                        p.wait(10)

        return [asyncio.run(go(w, c)) for c in concurrencies for w in worker_counts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="40 items")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--agents", default="1,2", help="agent-pool process counts to run")
    ap.add_argument("--slots", default="1,2", help="concurrent activities per agent process (crewwork default 2)")
    ap.add_argument("--no-procrastinate", action="store_true", help="skip the same-run SKIP LOCKED reference")
    ap.add_argument(
        "--peer-concurrency",
        default="1",
        help="Procrastinate jobs per worker process to run (1 = the reference setup; add crewwork's slots to compare "
        "at equal concurrency), comma-separated",
    )
    args = ap.parse_args()
    from bench.deps import require

    require(
        "bench/load.py",
        [] if args.no_procrastinate else ["psycopg", "psycopg_pool", "procrastinate"],
        hint="(or run without the same-run Procrastinate reference: --no-procrastinate)",
    )
    if args.quick:
        args.items = 40
    runs = []
    with pg_database("crewwork_load") as (url, _db):
        for slots in [int(x) for x in args.slots.split(",")]:
            for agents in [int(x) for x in args.agents.split(",")]:
                r = run_config(url, agents, slots, args.items, args.clients)
                print(
                    f"agents={agents} slots={slots}: {r['tasks_per_s']:.1f} tasks/s, submit-to-result p50 "
                    f"{r['submit_to_result_s']['p50']:.2f}s {r['states']} {r['errors'][:1]}; CPU s used: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_s"].items()),
                    flush=True,
                )
                runs.append(r)
    if not args.no_procrastinate:
        agents = [int(x) for x in args.agents.split(",")]
        concs = [int(x) for x in args.peer_concurrency.split(",")]
        for r in procrastinate_reference(agents, args.items, args.clients, concs):
            print(
                f"procrastinate workers={r['agent_processes']} concurrency={r['agent_slots_per_process']}: "
                f"{r['tasks_per_s']:.1f} tasks/s, submit-to-result p50 {r['submit_to_result_s']['p50']:.2f}s",
                flush=True,
            )
            runs.append(r)
    from bench.report import load_table as render

    print()
    print(render({"runs": runs, "reference": REFERENCE}))
    print("reference: SKIP LOCKED platform, 8 tasks/s (1 worker) and 14 (2), submit-to-result p50 4.6 s / 2.4 s")
    write_results("load", {"runs": runs, "reference": REFERENCE})


if __name__ == "__main__":
    main()
