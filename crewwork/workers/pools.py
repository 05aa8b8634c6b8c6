"""Worker pools: one process per pool (`crewwork worker --pool NAME`), each polling its own task queue.

| pool     | runs                                              |
|----------|---------------------------------------------------|
| control  | WorkItemWorkflow + store/lease/record/land work   |
| agent    | agent execution (long, heartbeating)               |
| validate | validation runs in sandboxes                      |

A pool drains on SIGTERM/SIGINT: it stops polling and gives in-flight activities a grace period to finish before
they are cancelled (and retried elsewhere by Temporal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
from datetime import timedelta
from pathlib import Path

from temporalio.worker import Worker

from crewwork.activities.control import ControlActivities
from crewwork.activities.execute import ExecuteActivities
from crewwork.config import Settings
from crewwork.observability import activity_interceptors, start_pool_observability
from crewwork.store.store import Store
from crewwork.temporal.client import connect
from crewwork.workflows.work_item import WorkItemWorkflow

log = logging.getLogger("crewwork.workers")

POOLS = ("control", "agent", "validate")
GRACEFUL_SHUTDOWN = timedelta(seconds=20)
HEALTH_DIR = Path(tempfile.gettempdir()) / "crewwork-health"
HEALTH_INTERVAL_S = 5.0


def build_worker(pool: str, client, store: Store, settings: Settings) -> Worker:  # type: ignore[no-untyped-def]
    if pool not in POOLS:
        raise ValueError(f"unknown pool {pool!r}; pools are: {', '.join(POOLS)}")
    queue = settings.task_queue(pool)
    if pool == "control":
        control = ControlActivities(store, settings)
        return Worker(
            client,
            task_queue=queue,
            workflows=[WorkItemWorkflow],
            activities=[
                control.admit,
                control.set_state,
                control.acquire_workspace,
                control.renew_workspace,
                control.release_workspace,
                control.record_attempt,
                control.land_change,
                control.finish,
                control.cleanup,
            ],
            max_concurrent_activities=settings.control_concurrency,
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
            interceptors=activity_interceptors(),
        )
    execute = ExecuteActivities(store, settings)
    if pool == "agent":
        return Worker(
            client,
            task_queue=queue,
            activities=[execute.run_agent],
            max_concurrent_activities=settings.agent_concurrency,
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
            interceptors=activity_interceptors(),
        )
    return Worker(
        client,
        task_queue=queue,
        activities=[execute.validate_change],
        max_concurrent_activities=settings.validate_concurrency,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        interceptors=activity_interceptors(),
    )


async def run_pool(pool: str, settings: Settings) -> None:
    # Observability first: JSON logs and the Temporal SDK metrics runtime must be in place before connecting.
    store = Store(settings.resolved_database_url(), pool_size=settings.db_pool_size)
    metrics_server = await start_pool_observability(pool, settings.task_queue(pool), store)
    client = await connect(settings)
    worker = build_worker(pool, client, store, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("pool %s polling task queue %s", pool, settings.task_queue(pool))
    print(f"crewwork worker: pool {pool} polling {settings.task_queue(pool)}", flush=True)
    alive = asyncio.create_task(_report_alive(pool, stop))
    async with worker:
        await stop.wait()
        log.info("pool %s draining (grace %ss)", pool, GRACEFUL_SHUTDOWN.total_seconds())
        print(f"crewwork worker: pool {pool} draining", flush=True)
    await alive
    if metrics_server is not None:
        metrics_server.close()
    await store.close()
    print(f"crewwork worker: pool {pool} drained", flush=True)


async def _report_alive(pool: str, stop: asyncio.Event) -> None:
    """Touch HEALTH_DIR/worker-POOL.alive from the event loop: a container health check reads its age, so a
    wedged loop (not just a dead process) makes the container unhealthy."""
    path = HEALTH_DIR / f"worker-{pool}.alive"
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
    while not stop.is_set():
        with contextlib.suppress(OSError):
            path.touch()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEALTH_INTERVAL_S)
