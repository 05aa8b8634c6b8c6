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
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.worker import (
    Interceptor,
    PollerBehaviorAutoscaling,
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowRunner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import crewwork.workflows as pkg
from crewwork import tracing
from crewwork.config import Settings
from crewwork.observability import activity_interceptors, start_pool_observability
from crewwork.reconcile import Reconciler
from crewwork.steps.ports import Ports
from crewwork.steps.registry import activities
from crewwork.steps.step import HEARTBEAT_THROTTLE
from crewwork.store.store import Store
from crewwork.temporal.client import connect
from crewwork.workers.slots import SlotInterceptor, agent_done, poll_ahead_tuner
from crewwork.workflows.evidence import EvidenceBundleWorkflow
from crewwork.workflows.work_item import WorkItemWorkflow

log = logging.getLogger("crewwork.workers")

POOLS = ("control", "agent", "validate")
GRACEFUL_SHUTDOWN = timedelta(seconds=20)
HEALTH_DIR = Path(tempfile.gettempdir()) / "crewwork-health"
HEALTH_INTERVAL_S = 5.0


def worker_tuning(pool: str, settings: Settings) -> dict[str, Any]:
    """Slots, pollers and the slot interceptor of a pool's worker (the bare-Temporal baseline in bench/ uses the
    same, so that comparisons measure crewwork and not the tuning)."""
    if pool == "control":
        return {
            "max_concurrent_activities": settings.control_concurrency,
            # A new work item's first workflow task can only be taken by a non-sticky poll, so a burst of
            # submissions waits on those: half the polls are non-sticky, not the SDK's 1 in 6 (figures in
            # docs/performance.md, "Figures behind the code").
            "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(settings.workflow_task_pollers),
            "nonsticky_to_sticky_poll_ratio": 1.0,
        }
    # Activity polls scale with the backlog (the server says how much is waiting), up to the slots free.
    if pool == "agent" and settings.agent_poll_ahead:
        # An agent slot polls for its next task once its agent returns, not once its completion is sent
        # (crewwork/workers/slots.py); the interceptor gives each attempt the ticket that says so.
        tuner, slots = poll_ahead_tuner(settings.agent_concurrency)
        return {
            "tuner": tuner,
            "activity_task_poller_behavior": PollerBehaviorAutoscaling(),
            "interceptors": [SlotInterceptor(slots)],
        }
    n = settings.agent_concurrency if pool == "agent" else settings.validate_concurrency
    return {"max_concurrent_activities": n, "activity_task_poller_behavior": PollerBehaviorAutoscaling()}


def pool_activities(pool: str, client: Any, store: Store, settings: Settings) -> list[Any]:
    """The activities each pool's task queue serves: the steps whose policy names the pool (crewwork/steps/registry.py),
    bound to this worker's ports."""
    ports = Ports.build(store, settings, client=client, agent_done=agent_done)
    if pool == "agent" and settings.agent_isolation == "process":
        ports.agent_processes.prestart()  # warm children, so the first task does not wait for their imports
    return activities(pool, ports)  # type: ignore[arg-type]


def build_worker(
    pool: str, client: Any, store: Store, settings: Settings, *, extra_interceptors: Sequence[Interceptor] = ()
) -> Worker:
    if pool not in POOLS:
        raise ValueError(f"unknown pool {pool!r}; pools are: {', '.join(POOLS)}")
    workflows: dict[str, Any] = {}
    if pool == "control":
        if settings.workflow_sandbox != "off":  # only the sandbox re-imports the workflow module per run
            _cache_workflow_bytecode()
        workflows = {
            "workflows": [WorkItemWorkflow, EvidenceBundleWorkflow],
            "workflow_runner": workflow_runner(settings.workflow_sandbox),
        }
    tuning = worker_tuning(pool, settings)
    own = tuning.pop("interceptors", [])
    return Worker(
        client,
        task_queue=settings.task_queue(pool),
        activities=pool_activities(pool, client, store, settings),
        **workflows,
        **tuning,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        interceptors=[*own, *activity_interceptors(), *extra_interceptors],
    )


def workflow_runner(mode: str = "off") -> WorkflowRunner:
    """The control pool's workflow runner (`CREWWORK_WORKFLOW_SANDBOX`).

    Temporal's sandbox re-imports every module not passed through for each workflow run it starts, and wraps every
    activation in its import hooks, which costs CPU per workflow task (docs/performance.md, "Figures behind the
    code"). `passthrough` already gives up the sandbox's module-level restrictions (`datetime.now`, `random`, ...
    are not intercepted in a passed-through module), so `off` is the default, and determinism is guarded where it is
    cheaper and stricter: tests/unit/test_workflow_determinism.py rejects
    clock, randomness, I/O and threading in the workflow modules by reading their source, and the committed
    histories are replayed under the *full* sandbox in tests/integration/test_replay.py."""
    if mode == "full":
        return SandboxedWorkflowRunner()
    if mode == "passthrough":
        return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("crewwork"))
    if mode == "off":
        return UnsandboxedWorkflowRunner()
    raise ValueError(f"CREWWORK_WORKFLOW_SANDBOX must be full, passthrough or off, not {mode!r}")


def _cache_workflow_bytecode() -> None:
    """Write the bytecode of the workflow modules if it is missing.

    Temporal's workflow sandbox executes the workflow module afresh for every workflow run it starts. Without a
    `.pyc` (PYTHONDONTWRITEBYTECODE, a fresh checkout) that means compiling the workflow modules' source once per
    work item. py_compile writes the cache whatever PYTHONDONTWRITEBYTECODE says; on a read-only install (the image
    compiles at build time) it is a no-op."""
    import compileall

    with contextlib.suppress(OSError):
        for d in pkg.__path__:
            compileall.compile_dir(d, quiet=1, force=False)


async def run_pool(pool: str, settings: Settings, *, extra_interceptors: Sequence[Interceptor] = ()) -> None:
    await run_pools([pool], settings, extra_interceptors=extra_interceptors)


async def run_pools(
    pools: Sequence[str], settings: Settings, *, extra_interceptors: Sequence[Interceptor] = ()
) -> None:
    """Run one or several pools in this process (`crewwork worker --pool control,agent`): one Temporal client, one
    store connection pool and one event loop for all of them, each pool its own Worker on its own task queue.

    Several pools in one process cost less CPU per item than the same pools as separate processes (one SDK runtime,
    one event loop woken instead of two: docs/performance.md, "Pools in one process"), at the price of the
    separation: a pool that wedges or is killed takes the others in its process with it, and they scale together."""
    unknown = [p for p in pools if p not in POOLS]
    if unknown or not pools or len(set(pools)) != len(pools):
        raise ValueError(f"pools must be distinct names among {', '.join(POOLS)}, not {', '.join(pools) or 'none'}")
    name = "+".join(pools)
    # Observability first: JSON logs and the Temporal SDK metrics runtime must be in place before connecting.
    # No pre-ping in the pools: fenced writes retry a dead pooled connection themselves (Store._transaction).
    store = Store(
        settings.resolved_database_url(),
        pool_size=settings.db_pool_size,
        pre_ping=False,
        unavailable_wait_s=settings.store_unavailable_wait_s,
        server_writes=settings.store_server_writes,
    )
    metrics_server = None
    for i, pool in enumerate(pools):
        # One metrics server and one SDK metrics runtime per process (the ports are the first pool's to open);
        # every pool's identity (POOL_INFO) is on it.
        server = start_pool_observability(
            pool,
            settings.task_queue(pool),
            metrics_port=settings.metrics_port if i == 0 else None,
            temporal_metrics_port=settings.temporal_metrics_port if i == 0 else None,
        )
        metrics_server = metrics_server or server
    tracing.configure(settings, f"crewwork-worker-{name}")  # before connect: the client carries the interceptor
    client = await connect(settings)
    workers = [build_worker(pool, client, store, settings, extra_interceptors=extra_interceptors) for pool in pools]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for pool in pools:
        log.info("pool %s polling task queue %s", pool, settings.task_queue(pool))
        print(f"crewwork worker: pool {pool} polling {settings.task_queue(pool)}", flush=True)
    alive = [asyncio.create_task(_report_alive(pool, stop)) for pool in pools]
    reconciler = None
    if "control" in pools and settings.reconcile_interval_s > 0:
        reconciler = asyncio.create_task(Reconciler(store, client, settings).run(stop))
    async with contextlib.AsyncExitStack() as running:
        for worker in workers:
            await running.enter_async_context(worker)
        await stop.wait()
        if reconciler is not None:
            # Cut short, not waited for: each item's end is one fenced write, and the next pool's pass takes over.
            reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconciler
        log.info("pool %s draining (grace %ss)", name, GRACEFUL_SHUTDOWN.total_seconds())
        for pool in pools:
            print(f"crewwork worker: pool {pool} draining", flush=True)
        # Drained side by side, not one after the other (each may take its whole grace period); leaving the
        # block asks each again, which returns at once.
        await asyncio.gather(*(worker.shutdown() for worker in workers))
    for task in alive:
        await task
    if metrics_server is not None:
        metrics_server.close()
    await store.close()
    tracing.shutdown()
    for pool in pools:
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
