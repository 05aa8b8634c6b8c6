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


async def _worker(role: str, address: str, prefix: str, slots: int) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    # By the module's name, not __main__: Temporal's workflow sandbox refuses workflows defined in __main__.
    from bench.bare_load import BareTask, bare_agent
    from crewwork.config import Settings
    from crewwork.workers.pools import worker_tuning, workflow_runner

    client = await Client.connect(address)
    settings = Settings(agent_concurrency=slots, agent_poll_ahead=True)
    if role == "control":
        worker = Worker(
            client,
            task_queue=f"{prefix}-control",
            workflows=[BareTask],
            # crewwork's control pool's runner too (no sandbox by default): Temporal's default sandbox costs a few
            # ms of CPU per workflow, which would lift the floor.
            workflow_runner=workflow_runner(settings.workflow_sandbox),
            **worker_tuning("control", settings),
        )
    else:
        worker = Worker(
            client, task_queue=f"{prefix}-agent", activities=[bare_agent], **worker_tuning("agent", settings)
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
    if len(sys.argv) == 6 and sys.argv[1] == "worker":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from crewwork import eventloop
        from crewwork.config import Settings

        # The event loop crewwork's pools run on (CREWWORK_EVENT_LOOP, uvloop by default): part of their tuning.
        eventloop.run(_worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])), Settings())
        # As `crewwork` does (crewwork/cli/__init__.py run): the Temporal SDK's native threads outlive the interpreter
        # and abort its finalization ("Fatal Python error: PyGILState_Release", temporalio/sdk-python#300).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    else:
        sys.exit("usage: python -m bench.bare_load worker control|agent ADDRESS PREFIX SLOTS")
