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
import sys
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
from crewwork.admission.reconcile import Reconciler
from crewwork.boundary import hostproc
from crewwork.config import Settings
from crewwork.models.pools import POOLS
from crewwork.observability import tracing
from crewwork.observability.pools import activity_interceptors, start_pool_observability
from crewwork.steps.ports import Ports
from crewwork.steps.registry import activities
from crewwork.steps.step import HEARTBEAT_THROTTLE
from crewwork.steps.sweep import run_sweeps
from crewwork.store.store import Store
from crewwork.temporal.client import connect
from crewwork.temporal.deployment import deployment_config
from crewwork.workers.schedules import ensure_retention_schedule
from crewwork.workers.slots import SlotInterceptor, agent_done, poll_ahead_tuner
from crewwork.workflows.bundle import EvidenceBundleWorkflow
from crewwork.workflows.reaper import RetentionWorkflow
from crewwork.workflows.replay import ReplayWorkflow
from crewwork.workflows.work_item import WorkItemWorkflow

log = logging.getLogger("crewwork.workers")

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
            "workflows": [WorkItemWorkflow, EvidenceBundleWorkflow, ReplayWorkflow, RetentionWorkflow],
            "workflow_runner": workflow_runner(settings.workflow_sandbox),
        }
    tuning = worker_tuning(pool, settings)
    own = tuning.pop("interceptors", [])
    versioned = deployment_config(settings)
    if versioned is not None:
        # Every pool of one build declares the same version: a pinned item's activities go to its own build's
        # agent and validate pools too (crewwork/temporal/deployment.py).
        tuning["deployment_config"] = versioned
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


class StartupRefused(ValueError):
    """A pool process will not start with these settings; the message says which setting and why, one per line."""


def startup_check(pools: Sequence[str], settings: Settings) -> list[str]:
    """What a process running `pools` must refuse to start with (StartupRefused), and warns about (returned, and
    logged): a control pool signs evidence at landing, so its signing key is checked now, not when the first item
    lands (a missing or unpublished key ended every item `dead` there; crewwork.attestation.publish)."""
    if "control" not in pools:
        return []
    from crewwork.attestation.publish import check_signing_key

    check = check_signing_key(settings.evidence)
    for warning in check.warnings:
        log.warning("%s", warning)
    if check.errors:
        raise StartupRefused("\n".join(check.errors))
    return check.warnings


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
    # The bounds of every git process and parse this process starts on tenant input (docs/bounds.md).
    hostproc.configure_from(settings)
    for warning in startup_check(pools, settings):
        print(f"crewwork worker: WARNING: {warning}", file=sys.stderr, flush=True)
    # Observability first: JSON logs and the Temporal SDK metrics runtime must be in place before connecting.
    # No pre-ping in the pools: fenced writes retry a dead pooled connection themselves (Store._transaction).
    store = Store(
        settings.resolved_database_url(),
        pool_size=settings.db_pool_size,
        pre_ping=False,
        unavailable_wait_s=settings.store_unavailable_wait_s,
        server_writes=settings.store_server_writes,
        driver_writes=settings.store_driver_writes,
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
    build = settings.deployment.build_id
    version = f" as {settings.deployment.name}:{build}" if build else ""
    for pool in pools:
        log.info("pool %s polling task queue %s%s", pool, settings.task_queue(pool), version)
        print(f"crewwork worker: pool {pool} polling {settings.task_queue(pool)}{version}", flush=True)
    if "control" in pools:
        try:
            await ensure_retention_schedule(client, settings)
        except Exception as exc:  # the pool runs without it; the next control pool to start tries again
            log.warning("could not keep the retention schedule: %s", exc)
    alive = [asyncio.create_task(_report_alive(pool, stop)) for pool in pools]
    # What attempts that died on this host left (workspaces, sandboxes, locks): at start, then periodically.
    alive.append(asyncio.create_task(run_sweeps(settings, stop)))
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
