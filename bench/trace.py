"""Where a `task` item's time goes under the load test: the same stack and load as bench/load.py, then each item's
Temporal history is read back and its life is split into phases (server clock), printed as p50/p95 per phase.

Phases of a `task` item (see crewwork/workflows/work_item.py):
- start: the API's POST starting the workflow -> first workflow task started (waiting for a control poller);
- wft1: first workflow task (admit as a local activity, schedule run_agent);
- agent wait: run_agent scheduled -> started (waiting for an agent slot);
- agent run: run_agent started -> completed (lease, fenced writes, the 100 ms mock agent);
- wft2 wait: run_agent completed -> next workflow task started;
- wft2: that workflow task (record_attempt and finish as local activities) -> workflow completed.

    .venv/bin/python bench/trace.py [--items 100] [--clients 12] [--agents 1] [--slots 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.harness import pg_database, proc_cpu_s, summary, table
from bench.load import drive, load_stack
from crewwork.store.store import Store
from crewwork.store.tables import WorkItem


def phases(events: list[Any]) -> dict[str, float]:
    t: dict[str, list[float]] = {}
    for e in events:
        name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        t.setdefault(name, []).append(e.event_time.ToDatetime().timestamp())
    wft_started = t.get("WORKFLOW_TASK_STARTED", [])
    wft_done = t.get("WORKFLOW_TASK_COMPLETED", [])
    out: dict[str, float] = {}
    start = t["WORKFLOW_EXECUTION_STARTED"][0]
    if wft_started:
        out["start"] = wft_started[0] - start
    if wft_done and wft_started:
        out["wft1"] = wft_done[0] - wft_started[0]
    sched, started, completed = (
        t.get(k, [0])[0] for k in ("ACTIVITY_TASK_SCHEDULED", "ACTIVITY_TASK_STARTED", "ACTIVITY_TASK_COMPLETED")
    )
    if sched and started:
        out["agent wait"] = started - sched
    if started and completed:
        out["agent run"] = completed - started
    later = [s for s in wft_started if completed and s >= completed]
    if later:
        out["wft2 wait"] = later[0] - completed
        end = t.get("WORKFLOW_EXECUTION_COMPLETED", [later[0]])[0]
        out["wft2"] = end - later[0]
    if "WORKFLOW_EXECUTION_COMPLETED" in t:
        out["total"] = t["WORKFLOW_EXECUTION_COMPLETED"][0] - start
    out["workflow tasks"] = float(len(wft_started))
    out["history events"] = float(len(events))
    return out


async def histories(address: str, url: str, ids: list[str]) -> list[dict[str, float]]:
    client = await Client.connect(address)
    store = Store(url)
    async with store.session() as s:
        wfs = (await s.execute(select(WorkItem.workflow_id).where(WorkItem.id.in_(ids)))).scalars().all()
    await store.close()
    out = []
    for wf in wfs:
        hist = await client.get_workflow_handle(wf).fetch_history()
        out.append(phases(list(hist.events)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--agents", type=int, default=1)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--control", type=int, default=1)
    ap.add_argument("--profile", default="", help="pool process to sample with py-spy during the run (e.g. control-0)")
    args = ap.parse_args()
    with pg_database("crewwork_trace") as (url, _db), tempfile.TemporaryDirectory(prefix="crewwork-trace-") as tmp:
        stack = load_stack(Path(tmp), url, args.agents, args.slots, control=args.control)
        stack.start()
        try:
            time.sleep(2.0)
            asyncio.run(drive(stack, url, 4, 4, 60))
            cpu0 = {p.name: proc_cpu_s(p.proc.pid) for p in stack.processes if p.proc}
            tpid = stack.temporal.proc.pid if stack.temporal and stack.temporal.proc else 0
            cpu0["temporal"] = proc_cpu_s(tpid)
            spy = None
            if args.profile:
                import subprocess

                pid = next(p.proc.pid for p in stack.processes if p.name == args.profile and p.proc)
                spy = subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        "record",
                        "-p",
                        str(pid),
                        "-f",
                        "raw",
                        "-r",
                        "200",
                        "-o",
                        f"/tmp/prof-{args.profile}.txt",
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            out = asyncio.run(drive(stack, url, args.items, args.clients, 300))
            if spy is not None:
                import signal as _signal

                spy.send_signal(_signal.SIGINT)
                spy.wait(30)
            cpu = {p.name: proc_cpu_s(p.proc.pid) - cpu0[p.name] for p in stack.processes if p.proc}
            cpu["temporal"] = proc_cpu_s(tpid) - cpu0["temporal"]
            store = Store(url)

            async def ids() -> list[str]:
                async with store.session() as s:
                    return list((await s.execute(select(WorkItem.id))).scalars().all())

            all_ids = asyncio.run(ids())
            asyncio.run(store.close())
            assert stack.temporal is not None
            traces = asyncio.run(histories(stack.temporal.address, url, all_ids))
        finally:
            stack.stop()
    keys = [
        "start",
        "wft1",
        "agent wait",
        "agent run",
        "wft2 wait",
        "wft2",
        "total",
        "workflow tasks",
        "history events",
    ]
    rows = []
    for k in keys:
        vals = [t[k] for t in traces if k in t]
        s = summary(vals)
        rows.append([k, len(vals), s["p50"], s["p95"], s["max"] if "max" in s else max(vals)])
    print(
        f"{out['tasks_per_s']:.1f} tasks/s, submit-to-result p50 {out['submit_to_result_s']['p50']:.2f}s, "
        f"submit p50 {out['submit_latency_s']['p50']:.3f}s; CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
    )
    print(table(["phase (s)", "n", "p50", "p95", "max"], rows))


if __name__ == "__main__":
    main()
