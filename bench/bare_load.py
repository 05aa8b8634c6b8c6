"""The load test's Temporal floor: the same 100 tasks of a 100 ms mock agent on bare Temporal, in crewwork's shape.

A workflow per task on a control queue, served by one workflow worker process, runs one 100 ms activity on an agent
queue, served by one activity worker process of N slots. The workers are tuned exactly like crewwork's control and
agent pools (`crewwork.workers.pools.worker_tuning`: the same pollers, and the same poll-ahead slot supplier; the
same event loop, `CREWWORK_EVENT_LOOP`; the same workflow runner, without Temporal's sandbox by default), on the
same Temporal dev server with the same flags. What bare Temporal leaves out is everything crewwork adds: the HTTP API,
the store, fencing, admission, evidence, the agent's child process. So it is the floor any design in this shape has
on this machine: what one slot can do at most when Temporal carries each task.

Workflows are started by 12 coroutines in this process straight through the Temporal client (no HTTP, like the
SKIP LOCKED reference's direct `defer`).

    (used by bench/load.py; a worker process: python -m bench.bare_load worker ROLE ADDRESS PREFIX SLOTS)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

MOCK_AGENT_S = 0.1


@activity.defn(name="bare_agent")
async def bare_agent(delay_s: float) -> float:
    await asyncio.sleep(delay_s)
    return delay_s


# The store floor's activity: after the agent's 100 ms, the result and its `state_changed` event in one statement, on
# crewwork's own tables (the least a result store needs: the result, durably, where a client reads it).
FINISH = """
WITH clock AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
ev AS (
    INSERT INTO events (work_item_id, tenant_id, type, data, rank, created_at)
    SELECT w.id, w.tenant_id, 'state_changed', '{"state": "succeeded"}'::json, 0, clock.now
    FROM work_items w, clock WHERE w.id = $1
)
UPDATE work_items SET state = 'succeeded', result = $2::json, updated_at = (SELECT now FROM clock) WHERE id = $1
"""
_POOL: list[Any] = []  # the agent worker's asyncpg pool, in the store floor


@activity.defn(name="bare_agent_stored")
async def bare_agent_stored(work_item_id: str) -> float:
    await asyncio.sleep(MOCK_AGENT_S)
    await _POOL[0].execute(FINISH, work_item_id, '{"output": {}}')
    return MOCK_AGENT_S


@workflow.defn(name="BareStoredTask")
class BareStoredTask:
    """The store floor's workflow: started by bench/bare_api.py for a row it inserted, one activity that ends by
    storing the result."""

    @workflow.run
    async def run(self, args: dict[str, str]) -> float:
        return await workflow.execute_activity(
            "bare_agent_stored",
            args["id"],
            task_queue=args["agent_queue"],
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=8),
            result_type=float,
        )


@workflow.defn(name="BareTask")
class BareTask:
    @workflow.run
    async def run(self, agent_queue: str) -> float:
        return await workflow.execute_activity(
            "bare_agent",
            MOCK_AGENT_S,
            task_queue=agent_queue,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=8),
            result_type=float,
        )


async def _worker(role: str, address: str, prefix: str, slots: int, dsn: str = "") -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    # By the module's name, not __main__: Temporal's workflow sandbox refuses workflows defined in __main__.
    from bench.bare_load import _POOL, BareStoredTask, BareTask, bare_agent, bare_agent_stored
    from crewwork.config import Settings
    from crewwork.workers.pools import worker_tuning, workflow_runner

    client = await Client.connect(address)
    settings = Settings(agent_concurrency=slots, agent_poll_ahead=True)
    if role == "control":
        worker = Worker(
            client,
            task_queue=f"{prefix}-control",
            workflows=[BareTask, BareStoredTask],
            # crewwork's control pool's runner too (no sandbox by default): Temporal's default sandbox costs a few
            # ms of CPU per workflow, which would lift the floor.
            workflow_runner=workflow_runner(settings.workflow_sandbox),
            **worker_tuning("control", settings),
        )
    else:
        if dsn:
            import asyncpg  # type: ignore[import-untyped]

            _POOL.append(await asyncpg.create_pool(dsn, min_size=2, max_size=10))
        worker = Worker(
            client,
            task_queue=f"{prefix}-agent",
            activities=[bare_agent, bare_agent_stored],
            **worker_tuning("agent", settings),
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with worker:
        print(f"bare worker {role} ready", flush=True)
        await stop.wait()


@contextlib.contextmanager
def bare_runner(items: int, clients: int) -> Iterator[Callable[[int], dict[str, Any]]]:
    """Yields `run(slots)`: a fresh dev server and two worker processes (control, agent of `slots`), the load, and
    its figures in bench/load.py's shape."""
    from bench.harness import postgres_cpu_s, proc_cpu_s, summary
    from crewwork.temporal.devserver import DevServer, free_port

    root = Path(__file__).resolve().parents[1]

    async def load(address: str, prefix: str, procs: list[subprocess.Popen[bytes]], server_pid: int) -> dict[str, Any]:
        from temporalio.client import Client

        client = await Client.connect(address)
        ids = [f"bare-{uuid.uuid4().hex[:10]}" for _ in range(items)]
        queue: asyncio.Queue[str] = asyncio.Queue()
        for i in ids:
            queue.put_nowait(i)
        submitted: dict[str, float] = {}
        lat: list[float] = []

        async def client_loop() -> None:
            while True:
                try:
                    wid = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t_wall, t0 = time.time(), time.perf_counter()
                await client.start_workflow(BareTask.run, f"{prefix}-agent", id=wid, task_queue=f"{prefix}-control")
                lat.append(time.perf_counter() - t0)
                submitted[wid] = t_wall

        cpu0 = [proc_cpu_s(p.pid) for p in procs]
        t_cpu0 = proc_cpu_s(server_pid)
        pg_cpu0 = postgres_cpu_s()  # bare Temporal uses none: what the host's PostgreSQL does meanwhile
        start, driver_cpu0 = time.time(), time.process_time()
        await asyncio.gather(*(client_loop() for _ in range(clients)))
        closed: dict[str, float] = {}
        waits: list[float] = []
        for wid in ids:
            await client.get_workflow_handle(wid).result()
        # The CPU used by the run ends here: the reads below are the benchmark's own (crewwork's runs read its store).
        cpu = sum(proc_cpu_s(p.pid) for p in procs) - sum(cpu0)
        t_cpu = proc_cpu_s(server_pid) - t_cpu0
        pg_cpu = postgres_cpu_s() - pg_cpu0
        driver_cpu_s = time.process_time() - driver_cpu0  # the load generator's own CPU, as bench/load.py's drive
        for wid in ids:
            handle = client.get_workflow_handle(wid)
            desc = await handle.describe()
            assert desc.close_time is not None
            closed[wid] = desc.close_time.timestamp()
            async for ev in handle.fetch_history_events():
                if ev.HasField("activity_task_started_event_attributes"):
                    waits.append(ev.event_time.ToDatetime().timestamp() - submitted[wid])
                    break
        end = max(closed.values())
        return {
            "system": "bare temporal",
            "agent_processes": 1,
            "tasks_per_s": len(closed) / (end - start),
            "submit_latency_s": summary(lat),
            "submit_to_result_s": summary([closed[w] - submitted[w] for w in closed]),
            "queue_wait_s": summary(waits),
            "states": {"succeeded": len(closed)},
            "cpu_s": {"workers": cpu, "temporal": t_cpu, "postgres": pg_cpu},
            "worker_cpu_ms_per_item": 1000 * cpu / items,
            "driver_cpu_ms_per_item": 1000 * driver_cpu_s / items,
            "loadavg": os.getloadavg()[0],
        }

    def run(slots: int) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="crewwork-bare-load-") as tmp:
            server = DevServer(Path(tmp), port=free_port(), ui=False)
            server.start()
            prefix = f"bare{uuid.uuid4().hex[:6]}"
            procs = [
                subprocess.Popen(
                    [sys.executable, "-m", "bench.bare_load", "worker", role, server.address, prefix, str(slots)],
                    cwd=root,
                    stdout=subprocess.DEVNULL,
                )
                for role in ("control", "agent")
            ]
            try:
                time.sleep(3.0)  # both connected and polling
                assert server.proc is not None
                # A warm-up, as crewwork's runs have: imports, connections and first tasks out of the way.
                asyncio.run(_warm(server.address, prefix))
                out = asyncio.run(load(server.address, prefix, procs, server.proc.pid))
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)
                server.stop()
        out["agent_slots_per_process"] = slots
        return out

    yield run


@dataclass
class _Front:
    """What bench/load.py's `drive` needs of a system with an HTTP front: where to post, and a key (unused here)."""

    api_url: str
    api_key: str = "unused"


@contextlib.contextmanager
def store_floor_runner(items: int, clients: int) -> Iterator[Callable[[int], dict[str, Any]]]:
    """Yields `run(slots)`: bare Temporal with the least of a product in front and behind, as a second floor: the
    bare submission route of bench/bare_api.py (the JSON body, the row and its `submitted` event in one statement,
    the workflow's start) and an activity that stores its result and a `state_changed` event in one statement, on
    crewwork's tables in a fresh PostgreSQL database, the same dev server and worker tuning as the floor above,
    driven by bench/load.py's own load generator (12 HTTP clients) and read back the same way. What it leaves out is
    what crewwork adds on top of a store and an API: authentication and rate limits, policy, admission and the
    tenant's queue, fencing and its events, the agent's child process, heartbeats, search attributes."""
    from bench.harness import pg_database, postgres_cpu_s, proc_cpu_s, tree_cpu_s, wait_http
    from bench.load import drive
    from crewwork.temporal.devserver import DevServer, free_port

    root = Path(__file__).resolve().parents[1]

    def run(slots: int) -> dict[str, Any]:
        with (
            tempfile.TemporaryDirectory(prefix="crewwork-bare-store-") as tmp,
            pg_database("crewwork_bare_store") as (url, _db),
        ):
            asyncio.run(_one_tenant(url))
            dsn = url.replace("postgresql+asyncpg://", "postgresql://")
            server = DevServer(Path(tmp), port=free_port(), ui=False)
            server.start()
            prefix = f"bares{uuid.uuid4().hex[:6]}"
            port = free_port()
            procs = {
                role: subprocess.Popen(
                    [sys.executable, "-m", "bench.bare_load", "worker", role, server.address, prefix, str(slots), dsn],
                    cwd=root,
                    stdout=subprocess.DEVNULL,
                )
                for role in ("control", "agent")
            }
            procs["api"] = subprocess.Popen(
                [
                    sys.executable,
                    str(root / "bench" / "bare_api.py"),
                    str(port),
                    dsn,
                    server.address,
                    f"{prefix}-control",
                    f"{prefix}-agent",
                ],
                cwd=root,
                stdout=subprocess.DEVNULL,
            )
            front = _Front(f"http://127.0.0.1:{port}")
            try:
                wait_http(f"{front.api_url}/docs", procs["api"])
                time.sleep(3.0)  # both workers connected and polling
                assert server.proc is not None
                asyncio.run(drive(front, url, 4, 4, 60))  # warm-up, as the others have
                tpid = server.proc.pid
                cpu0 = {k: tree_cpu_s(p.pid) for k, p in procs.items()}
                cpu0["temporal"], cpu0["postgres"] = proc_cpu_s(tpid), postgres_cpu_s()
                used: dict[str, float] = {}

                def cpu_at_end() -> None:
                    used.update({k: tree_cpu_s(p.pid) - cpu0[k] for k, p in procs.items()})
                    used["temporal"] = proc_cpu_s(tpid) - cpu0["temporal"]
                    used["postgres"] = postgres_cpu_s() - cpu0["postgres"]

                out = asyncio.run(drive(front, url, items, clients, 300, on_done=cpu_at_end))
                # drive() reads the stored rows and events: check what it found is every item, ended.
                if out["states"] != {"succeeded": items}:
                    raise RuntimeError(f"bench: the store floor ended with {out['states']} {out['errors']}")
            finally:
                for p in procs.values():
                    p.terminate()
                for p in procs.values():
                    p.wait(30)
                server.stop()
        out.update(
            {
                "system": "bare temporal + store + api",
                "agent_processes": 1,
                "agent_slots_per_process": slots,
                "cpu_s": used,
                "worker_cpu_ms_per_item": 1000 * (used["control"] + used["agent"]) / items,
                "loadavg": os.getloadavg()[0],
            }
        )
        return out

    yield run


async def _one_tenant(url: str) -> None:
    from crewwork.store.store import Store

    store = Store(url)
    try:
        await store.ensure_tenant("bare-store")
    finally:
        await store.close()


async def _warm(address: str, prefix: str) -> None:
    from temporalio.client import Client

    client = await Client.connect(address)
    handles = [
        await client.start_workflow(
            BareTask.run, f"{prefix}-agent", id=f"warm-{uuid.uuid4().hex[:8]}", task_queue=f"{prefix}-control"
        )
        for _ in range(4)
    ]
    for h in handles:
        await h.result()


if __name__ == "__main__":
    if len(sys.argv) in (6, 7) and sys.argv[1] == "worker":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from crewwork.cli import eventloop
        from crewwork.config import Settings

        # The event loop crewwork's pools run on (CREWWORK_EVENT_LOOP, uvloop by default): part of their tuning.
        eventloop.run(_worker(*sys.argv[2:5], int(sys.argv[5]), *sys.argv[6:]), Settings())
        # As `crewwork` does (crewwork/cli/__init__.py run): the Temporal SDK's native threads outlive the interpreter
        # and abort its finalization ("Fatal Python error: PyGILState_Release", temporalio/sdk-python#300).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    else:
        sys.exit("usage: python -m bench.bare_load worker control|agent ADDRESS PREFIX SLOTS [POSTGRES_DSN]")
