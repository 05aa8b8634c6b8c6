"""Fair sharing and killable slots, with figures (docs/operations.md, 'Fair sharing and killable work').

1. Tenant B's submit-to-done latency alone, then while tenant A floods the agent pool with blocking, spinning,
   zombie and crashing agent code and a cancel storm (the scenario of tests/reliability/test_flood.py: 3 agent
   slots, `tenant_max_in_flight` 2).
2. Slot freeing: one agent slot held by hostile agent code; seconds from the cancel to the item's `cancelled`, and
   to the next item's agent running in that slot.
3. What a task pays for running its agent in a child process: the same scripted task run inline and through the
   pool's warm child (no Temporal), and end to end through the pools with `agent_isolation` process vs inline.

    .venv/bin/python bench/flood.py [--b-items 10] [--a-rounds 5] [--flood-s 30] [--cancels 4] [--tasks 200]
    .venv/bin/python bench/flood.py --flood-only [--max-in-flight 1000] [--fairness]   # the queue vs fairness keys

Real Temporal dev server and PostgreSQL; CREWWORK_TEST_FAULTS=1 is set (the fault keys are a test switch).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import bench_settings, dev_server, in_process_pools, pct, pg_database, table, write_results
from crewwork.agents.base import AgentContext
from crewwork.agents.isolation import AgentProcesses, call_for
from crewwork.agents.scripted import ScriptedAgent
from crewwork.models import WorkItemKind
from tests.reliability.flood import run_flood, task

os.environ.setdefault("CREWWORK_TEST_FAULTS", "1")


def ms(values: list[float]) -> tuple[float, float]:
    return statistics.median(values) * 1000, pct(values, 95) * 1000


async def slot_freeing(tmp: Path, temporal: Any, db: str, cancels: int) -> list[list[Any]]:
    settings = bench_settings(tmp / "slots", temporal, db, agent_concurrency=1)
    rows = []
    async with in_process_pools(settings) as (service, store, tenant):
        for fault in ({"block_s": 600}, {"spin_s": 600}, {"stall_s": 600}):
            to_cancelled, to_next = [], []
            for _ in range(cancels):
                res = await service.submit(tenant, task(fault))
                wid = str(res.row.id)
                while (row := await store.get_work_item(wid)) is None or row.state != "running":
                    await asyncio.sleep(0.05)
                await asyncio.sleep(1.0)  # the agent is in its blocking code now
                t0 = time.monotonic()
                await service.cancel(row)
                nxt = str((await service.submit(tenant, task({"output": {}}))).row.id)
                cancelled_at = running_at = None
                while cancelled_at is None or running_at is None:
                    now = time.monotonic()
                    row = await store.get_work_item(wid)
                    if cancelled_at is None and row is not None and row.result is not None:
                        cancelled_at = now - t0
                    other = await store.get_work_item(nxt)
                    if running_at is None and other is not None and other.state in ("running", "succeeded"):
                        running_at = now - t0
                    await asyncio.sleep(0.05)
                to_cancelled.append(cancelled_at)
                to_next.append(running_at)
            rows.append(
                [
                    next(iter(fault)),
                    statistics.median(to_cancelled),
                    max(to_cancelled),
                    statistics.median(to_next),
                    max(to_next),
                ]
            )
    return rows


async def per_task_cost(n: int) -> dict[str, float]:
    def ctx() -> AgentContext:
        return AgentContext(work_item_id="wi_bench", attempt=1, activity_attempt=1, kind=WorkItemKind.task, config={})

    inline = []
    for _ in range(n):
        t0 = time.perf_counter()
        await ScriptedAgent().run(ctx())
        inline.append(time.perf_counter() - t0)
    pool = AgentProcesses(1)
    t0 = time.perf_counter()
    pool.prestart()
    first = await pool.acquire()
    await pool.release(first, healthy=True)
    start_s = time.perf_counter() - t0
    child = []
    for _ in range(n):
        c = ctx()
        t0 = time.perf_counter()
        await pool.run(call_for("scripted", "*", c), c)
        child.append(time.perf_counter() - t0)
    pool.close()
    return {
        "inline_median_ms": statistics.median(inline) * 1000,
        "child_median_ms": statistics.median(child) * 1000,
        "child_p95_ms": pct(child, 95) * 1000,
        "child_start_s": start_s,
    }


async def end_to_end(tmp: Path, temporal: Any, db: str, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"process": [], "inline": []}
    for round_ in range(2):  # interleaved, so load drift hits both alike
        for mode in ("process", "inline"):
            settings = bench_settings(tmp / f"e2e-{mode}-{round_}", temporal, db, agent_isolation=mode)
            async with in_process_pools(settings) as (service, store, tenant):
                for i in range(n // 2 + 2):
                    t0 = time.monotonic()
                    wid = str((await service.submit(tenant, task({"output": {"i": i}}))).row.id)
                    while (row := await store.get_work_item(wid)) is None or row.result is None:
                        await asyncio.sleep(0.02)
                    if i >= 2:  # the first two warm the workers up
                        out[mode].append(time.monotonic() - t0)
    return out


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d, pg_database("crewwork_flood") as (db, _name):
        tmp = Path(d)
        fairness = {"matching.enableFairness": "true"} if args.fairness else None
        with dev_server(tmp / "temporal", dynamic_config=fairness) as temporal:
            settings = bench_settings(
                tmp / "flood",
                temporal,
                db,
                agent_concurrency=3,
                tenant_max_in_flight=args.max_in_flight,
                fairness_keys=args.fairness,
            )
            async with in_process_pools(settings) as (service, store, _tenant):
                figures = await run_flood(
                    SimpleNamespace(service=service, store=store),
                    b_items=args.b_items,
                    a_rounds=args.a_rounds,
                    flood_s=args.flood_s,
                )
            s = figures.summary()
            print("\nTenant B's submit-to-done latency (3 agent slots, tenant_max_in_flight 2)\n")
            print(
                table(
                    ["phase", "items", "median s", "p95 s", "max s"],
                    [
                        [
                            "B alone",
                            s["baseline"]["n"],
                            s["baseline"]["median_s"],
                            s["baseline"]["p95_s"],
                            s["baseline"]["max_s"],
                        ],
                        [
                            "B while A floods",
                            s["flood"]["n"],
                            s["flood"]["median_s"],
                            s["flood"]["p95_s"],
                            s["flood"]["max_s"],
                        ],
                    ],
                )
            )
            ratio = s["flood"]["p95_s"] / max(s["baseline"]["p95_s"], 1e-9)
            print(
                f"\nA: {s['a_submitted']} items, {s['a_cancelled']} cancelled while holding a slot; "
                f"A's items ended {s['a_states']}. B's p95 under flood / alone: {ratio:.1f}x"
            )
            if args.flood_only:
                print(f"\nconfiguration: tenant_max_in_flight {args.max_in_flight}, fairness keys {args.fairness}")
                return
            slots = await slot_freeing(tmp, temporal, db, args.cancels)
            print("\nSlot freeing with one agent slot: seconds from the cancel\n")
            print(table(["agent code", "to cancelled (median)", "max", "to next item running (median)", "max"], slots))
            e2e = await end_to_end(tmp, temporal, db, args.e2e)
        cost = await per_task_cost(args.tasks)
    print("\nPer-task cost of the child process\n")
    print(
        table(
            ["measure", "inline", "child process", "difference"],
            [
                [
                    "scripted task, agent call only (median ms)",
                    cost["inline_median_ms"],
                    cost["child_median_ms"],
                    cost["child_median_ms"] - cost["inline_median_ms"],
                ],
                [
                    "task item submit-to-done (median ms)",
                    ms(e2e["inline"])[0],
                    ms(e2e["process"])[0],
                    ms(e2e["process"])[0] - ms(e2e["inline"])[0],
                ],
                [
                    "task item submit-to-done (p95 ms)",
                    ms(e2e["inline"])[1],
                    ms(e2e["process"])[1],
                    ms(e2e["process"])[1] - ms(e2e["inline"])[1],
                ],
            ],
        )
    )
    print(f"\nstarting a child (once per slot, and after each kill): {cost['child_start_s']:.2f}s")
    write_results(
        "flood",
        {
            "tenant_b": s,
            "slot_freeing": [
                dict(
                    zip(
                        [
                            "fault",
                            "cancelled_median_s",
                            "cancelled_max_s",
                            "next_running_median_s",
                            "next_running_max_s",
                        ],
                        r,
                        strict=True,
                    )
                )
                for r in slots
            ],
            "per_task": cost,
            "end_to_end_ms": {k: {"median": ms(v)[0], "p95": ms(v)[1], "n": len(v)} for k, v in e2e.items()},
        },
    )


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--b-items", type=int, default=10)
    p.add_argument("--a-rounds", type=int, default=5)
    p.add_argument("--flood-s", type=float, default=30.0)
    p.add_argument("--cancels", type=int, default=4)
    p.add_argument("--tasks", type=int, default=200)
    p.add_argument("--e2e", type=int, default=30)
    p.add_argument("--max-in-flight", type=int, default=2, help="tenant_max_in_flight of the flood (3 agent slots)")
    p.add_argument(
        "--fairness",
        action="store_true",
        help="task-queue fairness keys by tenant (CREWWORK_FAIRNESS_KEYS; the server with matching.enableFairness)",
    )
    p.add_argument("--flood-only", action="store_true", help="the flood part only (no results file written)")
    asyncio.run(main(p.parse_args()))
