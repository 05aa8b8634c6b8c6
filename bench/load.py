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

from bench.harness import pg_database, rss_mb, summary, table, task_spec, write_results
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
        rows = (await s.execute(select(WorkItem.id, WorkItem.state).where(WorkItem.id.in_(list(submitted))))).all()
        for _wid, state in rows:
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


def run_config(url: str, agents: int, slots: int, items: int, clients: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="crewwork-load-") as tmp:
        stack = Stack(
            Path(tmp),
            temporal_port=free_port(),
            ui_port=free_port(),
            api_port=free_port(),
            database_url=url,
            pool_counts={"control": 1, "agent": agents, "validate": 0},
            ui=False,
            extra_env={
                "CREWWORK_TASK_QUEUE_PREFIX": f"load{uuid.uuid4().hex[:6]}",
                "CREWWORK_AGENT_CONCURRENCY": str(slots),
                # The reference had no rate limit: 100 submits from one key must not be throttled.
                "CREWWORK_API_RATE_PER_S": "10000",
                "CREWWORK_API_RATE_BURST": "10000",
                "CREWWORK_LOG_LEVEL": "WARNING",
            },
        )
        stack.start()
        try:
            time.sleep(2.0)  # pools connect and start polling
            # Warm-up: a few items so imports, connections and first workflow tasks are out of the way.
            asyncio.run(drive(stack, url, 4, 4, 60))
            rss_before = {p.name: rss_mb(p.proc.pid) for p in stack.processes if p.proc}
            out = asyncio.run(drive(stack, url, items, clients, 300))
            out["rss_mb_after"] = {p.name: rss_mb(p.proc.pid) for p in stack.processes if p.proc}
            out["rss_mb_idle"] = rss_before
        finally:
            stack.stop()
    out.update({"agent_processes": agents, "agent_slots_per_process": slots})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="40 items")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--agents", default="1,2", help="agent-pool process counts to run")
    ap.add_argument("--slots", default="1,2", help="concurrent activities per agent process (crewwork default 2)")
    args = ap.parse_args()
    if args.quick:
        args.items = 40
    runs = []
    with pg_database("crewwork_load") as (url, _db):
        for slots in [int(x) for x in args.slots.split(",")]:
            for agents in [int(x) for x in args.agents.split(",")]:
                r = run_config(url, agents, slots, args.items, args.clients)
                print(
                    f"agents={agents} slots={slots}: {r['tasks_per_s']:.1f} tasks/s, submit-to-result p50 "
                    f"{r['submit_to_result_s']['p50']:.2f}s {r['states']} {r['errors'][:1]}",
                    flush=True,
                )
                runs.append(r)
    rows = []
    for r in runs:
        ref = REFERENCE.get(r["agent_processes"])
        rows.append(
            [
                r["agent_processes"],
                r["agent_slots_per_process"],
                r["tasks_per_s"],
                f"{r['tasks_per_s'] / ref['tasks_per_s']:.2f}x" if ref else "",
                r["submit_latency_s"]["p50"],
                r["submit_latency_s"]["p95"],
                r["submit_to_result_s"]["p50"],
                r["submit_to_result_s"]["p95"],
                f"{r['submit_to_result_s']['p50'] / ref['submit_to_result_p50_s']:.2f}x" if ref else "",
                r["queue_wait_s"]["p50"],
                r["queue_wait_s"]["p95"],
            ]
        )
    print()
    print(
        table(
            [
                "agent procs",
                "slots/proc",
                "tasks/s",
                "vs ref",
                "submit p50",
                "submit p95",
                "s2r p50",
                "s2r p95",
                "s2r p50 vs ref",
                "qwait p50",
                "qwait p95",
            ],
            rows,
        )
    )
    print("reference: SKIP LOCKED platform, 8 tasks/s (1 worker) and 14 (2), submit-to-result p50 4.6 s / 2.4 s")
    write_results("load", {"runs": runs, "reference": REFERENCE})


if __name__ == "__main__":
    main()
