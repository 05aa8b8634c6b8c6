"""The agent-task load test: 100 `task` work items whose mock agent takes 100 ms, submitted by 12 concurrent HTTP
clients through the real API. By default at equal concurrency against a PostgreSQL SKIP LOCKED queue
(Procrastinate) in the same run: one crewwork agent process of N slots beside one Procrastinate worker of N jobs,
for N = 1, 2, 8 (`--equal`), with each slot's efficiency (tasks/s per slot over the slot's limit for a 100 ms
agent) and the worker processes' CPU time per item; `--equal ''` runs the older grid of agent processes x slots.

Everything is a real process: the embedded stack (crewwork.cli.stack.Stack) runs the Temporal dev server, the API
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

    .venv/bin/python bench/load.py [--quick] [--items 100] [--clients 12] [--equal 1,2,8] [--rounds 1]
    .venv/bin/python bench/load.py --equal '' [--agents 1,2] [--slots 1,2] [--peer-concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from sqlalchemy import select

from bench.bare_load import bare_runner, store_floor_runner
from bench.harness import (
    pg_database,
    postgres_cpu_s,
    proc_cpu_s,
    rss_mb,
    summary,
    table,
    task_spec,
    tree_cpu_s,
    write_results,
)
from crewwork.cli.stack import Stack, crewwork_argv
from crewwork.models import WorkItemState
from crewwork.store.store import Store
from crewwork.store.tables import Event, WorkItem
from crewwork.temporal.devserver import free_port

REFERENCE = {
    1: {"tasks_per_s": 8.0, "submit_to_result_p50_s": 4.6},
    2: {"tasks_per_s": 14.0, "submit_to_result_p50_s": 2.4},
}
MOCK_AGENT_S = 0.1
TERMINAL = [s.value for s in WorkItemState if s.terminal]


class Front(Protocol):
    """Where the load generator submits: crewwork's Stack, or the store floor's bare API (bench/bare_load.py)."""

    @property
    def api_url(self) -> str: ...

    @property
    def api_key(self) -> str: ...


async def drive(
    stack: Front, url: str, items: int, clients: int, timeout_s: float, on_done: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Submit `items` tasks from `clients` HTTP clients and wait for every one to end. `on_done` is called once all
    have ended, before the benchmark's own reads of their states and events: where a run's CPU reading ends."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(items):
        queue.put_nowait(i)
    submitted: dict[str, float] = {}
    submit_lat: list[float] = []
    errors: list[str] = []

    async def client(http: httpx.AsyncClient) -> None:
        async with http:
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
    # The clients exist before the clock starts: building one (its SSL context) takes ~20 ms, and twelve of them
    # inside the measured window were 0.23 s of the load generator's own time (bench/trace.py's `fill` line).
    https = [httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=60) for _ in range(clients)]
    start, driver_cpu0 = time.time(), time.process_time()
    await asyncio.gather(*(client(h) for h in https))
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
    # The load generator's own CPU (its HTTP clients and its polling of the store), on the same cores as the stack:
    # not counted in the system's figures, reported so the two sides' generators can be compared.
    driver_cpu_s = time.process_time() - driver_cpu0
    if on_done is not None:
        on_done()
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
        "driver_cpu_ms_per_item": 1000 * driver_cpu_s / items,
    }


def load_stack(
    data_dir: Path,
    url: str,
    agents: int,
    slots: int,
    control: int = 1,
    env: dict[str, str] | None = None,
    one_process: bool = False,
) -> Stack:
    """The load test's stack: the API, `control` control processes and `agents` agent processes of `slots` each, on a
    throwaway Temporal dev server and the given database (`env`: more settings for every process). `one_process`:
    the control and agent pools in one process (`crewwork worker --pool control,agent`), named control-0."""
    if one_process and (control, agents) != (1, 1):
        raise SystemExit("bench: --one-process runs one process of the control and agent pools together")
    return Stack(
        data_dir,
        temporal_port=free_port(),
        ui_port=free_port(),
        api_port=free_port(),
        database_url=url,
        pool_counts={"control": control, "agent": 0 if one_process else agents, "validate": 0},
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
        worker_argv=(lambda _pool: crewwork_argv("worker", "--pool", "control,agent")) if one_process else None,
    )


def run_config(
    url: str, agents: int, slots: int, items: int, clients: int, one_process: bool = False
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="crewwork-load-") as tmp:
        stack = load_stack(Path(tmp), url, agents, slots, one_process=one_process)
        stack.start()
        try:
            time.sleep(2.0)  # pools connect and start polling
            # Warm-up: a few items so imports, connections and first workflow tasks are out of the way.
            asyncio.run(drive(stack, url, 4, 4, 60))
            rss_before = {p.name: rss_mb(p.proc.pid) for p in stack.processes if p.proc}
            cpu_before = {p.name: tree_cpu_s(p.proc.pid) for p in stack.processes if p.proc}
            tserver = stack.temporal.proc.pid if stack.temporal and stack.temporal.proc else 0
            cpu_before["temporal"] = proc_cpu_s(tserver)
            cpu_before["postgres"] = postgres_cpu_s()
            used: dict[str, float] = {}

            def cpu_at_end() -> None:
                # CPU seconds each process spent on the run (a pool with its agents' child processes): where the
                # time goes. PostgreSQL: every server process on the host (the driver's polling of the store too).
                used.update(
                    {p.name: tree_cpu_s(p.proc.pid) - cpu_before.get(p.name, 0.0) for p in stack.processes if p.proc}
                )
                used["temporal"] = proc_cpu_s(tserver) - cpu_before["temporal"]
                used["postgres"] = postgres_cpu_s() - cpu_before["postgres"]

            out = asyncio.run(drive(stack, url, items, clients, 300, on_done=cpu_at_end))
            out["cpu_s"] = used
            out["worker_cpu_ms_per_item"] = (
                1000 * sum(v for k, v in out["cpu_s"].items() if k.startswith(("agent", "control"))) / items
            )
            out["loadavg"] = os.getloadavg()[0]
            out["rss_mb_after"] = {p.name: rss_mb(p.proc.pid) for p in stack.processes if p.proc}
            out["rss_mb_idle"] = rss_before
        finally:
            stack.stop()
    out.update({"agent_processes": agents, "agent_slots_per_process": slots})
    return out


@contextlib.contextmanager
def procrastinate_runner(items: int, clients: int) -> Iterator[Callable[[int, int], dict[str, Any]]]:
    """The same load on Procrastinate (a PostgreSQL SKIP LOCKED job queue), in this run, on this machine: yields
    `run(workers, concurrency)`, which runs `workers` worker processes of `concurrency` jobs each, jobs deferred by
    `clients` concurrent coroutines (no HTTP in front). One database for every configuration: the peer's app is
    configured once, at import."""
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

                    cpu0 = sum(proc_cpu_s(p.pid) for p in procs)
                    start = time.time()
                    await asyncio.gather(*(client() for _ in range(clients)))
                    deadline = time.monotonic() + 300
                    while time.monotonic() < deadline and common.figures(db, ids, start)["done"] < items:
                        await asyncio.sleep(0.2)
                    cpu = sum(proc_cpu_s(p.pid) for p in procs) - cpu0
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
                        "cpu_s": {"workers": cpu},
                        "worker_cpu_ms_per_item": 1000 * cpu / items,
                        "loadavg": os.getloadavg()[0],
                    }
                finally:
                    for p in procs:
                        p.terminate()
                        p.wait(10)

        yield lambda workers, concurrency: asyncio.run(go(workers, concurrency))


def efficiency(r: dict[str, Any]) -> float:
    """Tasks/s per slot over the slot's limit for the mock agent's duration (1 / MOCK_AGENT_S)."""
    slots = r["agent_processes"] * r["agent_slots_per_process"]
    return r["tasks_per_s"] / slots * MOCK_AGENT_S


def equal_table(runs: list[dict[str, Any]]) -> str:
    """crewwork beside Procrastinate at each concurrency (one agent process of N slots, one worker of N jobs)."""
    rows = []
    by = {(r.get("system", "crewwork"), r["agent_slots_per_process"], r.get("round", 0)): r for r in runs}
    for (system, slots, rnd), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        peer = by.get(("procrastinate", slots, rnd))
        ratio = f"{r['tasks_per_s'] / peer['tasks_per_s']:.2f}x" if peer and system != "procrastinate" else ""
        s2r = (
            f"{r['submit_to_result_s']['p50'] / peer['submit_to_result_s']['p50']:.2f}x"
            if peer and system != "procrastinate"
            else ""
        )
        rows.append(
            [
                system,
                slots,
                rnd + 1,
                r.get("loadavg", 0.0),
                r["tasks_per_s"],
                ratio,
                efficiency(r),
                r["submit_to_result_s"]["p50"],
                s2r,
                r["submit_to_result_s"]["p95"],
                r.get("worker_cpu_ms_per_item", 0.0),
            ]
        )
    return table(
        [
            "system",
            "slots",
            "round",
            "load avg",
            "tasks/s",
            "vs SKIP LOCKED",
            "slot efficiency",
            "s2r p50 s",
            "vs SKIP LOCKED",
            "p95 s",
            "worker CPU ms/item",
        ],
        rows,
    )


def floor_table(runs: list[dict[str, Any]], items: int, floor: str = "bare temporal") -> str:
    """crewwork against a floor in the same round (bare Temporal, the floor of the shape; or `bare temporal + store +
    api`, bench/bare_load.py's store floor): throughput, submit-to-result p50 and CPU per item over every process
    each uses (crewwork: API, pools, Temporal server, PostgreSQL; bare: its worker processes, its API if any, the
    server, and PostgreSQL), per round and the median over rounds."""
    by = {(r.get("system", "crewwork"), r["agent_slots_per_process"], r.get("round", 0)): r for r in runs}
    per_slots: dict[int, list[tuple[float, float, float]]] = {}
    rows = []
    for (system, slots, rnd), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        bare = by.get((floor, slots, rnd))
        if system != "crewwork" or bare is None:
            continue
        cpu_c = 1000 * sum(r["cpu_s"].values()) / items
        cpu_b = 1000 * sum(bare["cpu_s"].values()) / items
        ratios = (
            r["tasks_per_s"] / bare["tasks_per_s"],
            r["submit_to_result_s"]["p50"] / bare["submit_to_result_s"]["p50"],
            cpu_c / cpu_b if cpu_b else float("nan"),
        )
        per_slots.setdefault(slots, []).append(ratios)
        rows.append(
            [slots, rnd + 1, f"{ratios[0]:.2f}", f"{ratios[1]:.2f}", f"{cpu_c:.1f}", f"{cpu_b:.1f}", f"{ratios[2]:.2f}"]
        )
    for slots, rs in sorted(per_slots.items()):
        med = [statistics.median(x[i] for x in rs) for i in range(3)]
        rows.append([slots, "median", f"**{med[0]:.2f}**", f"**{med[1]:.2f}**", "", "", f"**{med[2]:.2f}**"])
    return table(
        [
            "slots",
            "round",
            "tasks/s vs bare",
            "s2r p50 vs bare",
            "CPU ms/item crewwork",
            "CPU ms/item bare",
            "CPU vs bare",
        ],
        rows,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="40 items")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument(
        "--equal",
        default="1,2,8",
        help="concurrencies to run at equal concurrency: crewwork with one agent process of N slots beside "
        "Procrastinate with one worker of N jobs, alternating (empty: the grid of --agents x --slots instead)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the equal-concurrency comparison")
    ap.add_argument("--agents", default="1,2", help="grid: agent-pool process counts to run")
    ap.add_argument("--slots", default="1,2", help="grid: concurrent activities per agent process (default 2)")
    ap.add_argument("--no-procrastinate", action="store_true", help="skip the same-run SKIP LOCKED reference")
    ap.add_argument(
        "--no-bare",
        action="store_true",
        help="skip the same-run bare-Temporal floor (bench/bare_load.py) in the equal-concurrency comparison",
    )
    ap.add_argument(
        "--store-floor",
        action="store_true",
        help="also run bare Temporal with a bare HTTP route and a PostgreSQL result store in front and behind "
        "(bench/bare_load.py store_floor_runner), and compare crewwork with it too",
    )
    ap.add_argument(
        "--one-process",
        action="store_true",
        help="crewwork's control and agent pools in one process (crewwork worker --pool control,agent)",
    )
    ap.add_argument(
        "--peer-concurrency",
        default="1",
        help="grid: Procrastinate jobs per worker process to run (1 = the reference setup), comma-separated",
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
    runs: list[dict[str, Any]] = []

    def crewwork(agents: int, slots: int) -> dict[str, Any]:
        r = run_config(url, agents, slots, args.items, args.clients, one_process=args.one_process)
        print(
            f"crewwork agents={agents} slots={slots}: {r['tasks_per_s']:.1f} tasks/s "
            f"(slot efficiency {efficiency(r):.2f}), submit-to-result p50 {r['submit_to_result_s']['p50']:.2f}s "
            f"{r['states']} {r['errors'][:1]}; CPU s used: "
            + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_s"].items())
            + f"; load generator {r['driver_cpu_ms_per_item']:.1f} ms/item (not counted)",
            flush=True,
        )
        return r

    def peer_line(r: dict[str, Any]) -> None:
        print(
            f"procrastinate workers={r['agent_processes']} concurrency={r['agent_slots_per_process']}: "
            f"{r['tasks_per_s']:.1f} tasks/s (slot efficiency {efficiency(r):.2f}), submit-to-result p50 "
            f"{r['submit_to_result_s']['p50']:.2f}s",
            flush=True,
        )

    with contextlib.ExitStack() as stack:
        url, _db = stack.enter_context(pg_database("crewwork_load"))
        peer = None if args.no_procrastinate else stack.enter_context(procrastinate_runner(args.items, args.clients))
        bare = None if args.no_bare else stack.enter_context(bare_runner(args.items, args.clients))
        stored = stack.enter_context(store_floor_runner(args.items, args.clients)) if args.store_floor else None
        if args.equal:
            for rnd in range(args.rounds):
                for c in [int(x) for x in args.equal.split(",")]:
                    # Side by side, alternating which goes first each round, so all see the same machine.
                    order = ["crewwork", "procrastinate", "bare", "store"]
                    if rnd % 2:
                        order.reverse()
                    for system in order:
                        if system == "crewwork":
                            r = crewwork(1, c)
                        elif system == "procrastinate" and peer is not None:
                            r = peer(1, c)
                            peer_line(r)
                        elif system == "bare" and bare is not None:
                            r = bare(c)
                            print(
                                f"bare temporal slots={c}: {r['tasks_per_s']:.1f} tasks/s (slot efficiency "
                                f"{efficiency(r):.2f}), submit-to-result p50 {r['submit_to_result_s']['p50']:.2f}s; load "
                                f"generator {r['driver_cpu_ms_per_item']:.1f} ms/item (not counted)",
                                flush=True,
                            )
                        elif system == "store" and stored is not None:
                            r = stored(c)
                            print(
                                f"bare temporal + store + api slots={c}: {r['tasks_per_s']:.1f} tasks/s, "
                                f"submit-to-result p50 {r['submit_to_result_s']['p50']:.2f}s; CPU s used: "
                                + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_s"].items())
                                + f"; load generator {r['driver_cpu_ms_per_item']:.1f} ms/item (not counted)",
                                flush=True,
                            )
                        else:
                            continue
                        r["round"] = rnd
                        runs.append(r)
        else:
            for slots in [int(x) for x in args.slots.split(",")]:
                for agents in [int(x) for x in args.agents.split(",")]:
                    runs.append(crewwork(agents, slots))
            if peer is not None:
                for c in [int(x) for x in args.peer_concurrency.split(",")]:
                    for w in [int(x) for x in args.agents.split(",")]:
                        runs.append(peer(w, c))
                        peer_line(runs[-1])
    from bench.report import load_table as render

    print()
    if args.equal:
        print(equal_table(runs))
        print(
            "slot efficiency: tasks/s per slot over the slot's limit for a 100 ms agent (10 tasks/s); worker CPU: "
            "the agent and control processes (crewwork), the worker process (Procrastinate) or the two worker "
            "processes (bare temporal), CPU time per item. bare temporal: one 100 ms activity per workflow with "
            "crewwork's pool tuning and nothing else (no API, store, fencing): the floor of the Temporal shape"
        )
        if any(r.get("system") == "bare temporal" for r in runs):
            print(
                "\nagainst the floor (issue 31's targets: tasks/s >= 0.95 / 0.9 / 0.85 at 1 / 2 / 8 slots, s2r p50 <= 1.1,"
            )
            print("CPU <= 1.2, every process counted):")
            print(floor_table(runs, args.items))
        if any(r.get("system") == "bare temporal + store + api" for r in runs):
            print(
                "\nagainst bare Temporal with a bare HTTP route and a PostgreSQL result store (what crewwork adds "
                "beyond an API and a store):"
            )
            print(floor_table(runs, args.items, floor="bare temporal + store + api"))
    print(render({"runs": runs, "reference": REFERENCE}))
    print("reference: SKIP LOCKED platform, 8 tasks/s (1 worker) and 14 (2), submit-to-result p50 4.6 s / 2.4 s")
    write_results("load", {"runs": runs, "reference": REFERENCE})


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    main()
