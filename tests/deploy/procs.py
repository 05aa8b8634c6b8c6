"""Worker pools as separate OS processes (`python -m crewwork worker --pool NAME`), the shape of a multi-machine
deployment: each process has its own Temporal connection, database pool and worker identity (`PID@host`), and
shares nothing with the others except Temporal and PostgreSQL."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from crewwork.cli.stack import ManagedProcess
from crewwork.config import Settings


def pool_env(settings: Settings) -> dict[str, str]:
    """The environment a pool process gets: the same settings the test's own service uses, as CREWWORK_* vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env.update(
        {
            "CREWWORK_DATA_DIR": str(settings.data_dir),
            "CREWWORK_DATABASE_URL": settings.resolved_database_url(),
            "CREWWORK_TEMPORAL_ADDRESS": settings.temporal_address,
            "CREWWORK_TEMPORAL_NAMESPACE": settings.temporal_namespace,
            "CREWWORK_TASK_QUEUE_PREFIX": settings.task_queue_prefix,
            "CREWWORK_LEASE_TTL_S": str(settings.lease_ttl_s),
            "CREWWORK_REPO_ALLOW_NETWORKS": settings.repo_allow_networks,
            "CREWWORK_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if settings.sandbox.backend:
        env["CREWWORK_SANDBOX_BACKEND"] = settings.sandbox.backend
    return env


@dataclass
class PoolProcesses:
    """A set of pool processes; `identity(p)` is the Temporal worker identity the SDK gives it (PID@hostname)."""

    settings: Settings
    log_dir: Path
    procs: list[ManagedProcess] = field(default_factory=list)

    def start(self, pool: str, count: int = 1) -> list[ManagedProcess]:
        started = []
        for _ in range(count):
            i = sum(1 for p in self.procs if p.name.startswith(f"{pool}-"))
            p = ManagedProcess(
                f"{pool}-{i}",
                [sys.executable, "-m", "crewwork", "worker", "--pool", pool],
                pool_env(self.settings),
                self.log_dir / f"{pool}-{i}.log",
            )
            p.start()
            self.procs.append(p)
            started.append(p)
        for p in started:
            self.wait_polling(p)
        return started

    def wait_polling(self, p: ManagedProcess, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "polling" in self.log(p):
                return
            if not p.alive():
                raise RuntimeError(f"{p.name} exited early:\n{self.log(p)}")
            time.sleep(0.1)
        raise RuntimeError(f"{p.name} did not start polling:\n{self.log(p)}")

    def log(self, p: ManagedProcess) -> str:
        return p.log_path.read_text(errors="replace") if p.log_path.exists() else ""

    @staticmethod
    def identity(p: ManagedProcess) -> str:
        assert p.proc is not None
        return f"{p.proc.pid}@{socket.gethostname()}"

    def of(self, pool: str) -> list[ManagedProcess]:
        return [p for p in self.procs if p.name.startswith(f"{pool}-")]

    def kill(self, p: ManagedProcess, sig: int = signal.SIGKILL) -> None:
        assert p.proc is not None
        p.restart = False
        p.proc.send_signal(sig)

    def stop_all(self) -> None:
        for p in self.procs:
            p.stop(grace_s=25)


async def activity_identities(client: Client, workflow_id: str) -> dict[str, list[tuple[int, str]]]:
    """For each activity type in a workflow's history: (attempt, worker identity) of every completed start, and
    for "workflow_task", the identities that completed workflow tasks. Read from Temporal's own history, so it is
    what actually ran where, whoever claims otherwise."""
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    scheduled: dict[int, str] = {}
    async for ev in client.get_workflow_handle(workflow_id).fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[ev.event_id] = ev.activity_task_scheduled_event_attributes.activity_type.name
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = ev.activity_task_started_event_attributes
            out[scheduled[a.scheduled_event_id]].append((a.attempt, a.identity))
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            out["workflow_task"].append((0, ev.workflow_task_completed_event_attributes.identity))
    return out


async def pending_activity_workers(client: Client, workflow_id: str) -> dict[str, str]:
    """Activity type -> identity of the worker currently running it (pending activities in STARTED state)."""
    from temporalio.api.enums.v1 import PendingActivityState

    desc = await client.get_workflow_handle(workflow_id).describe()
    running: dict[str, Any] = {}
    for pa in desc.raw_description.pending_activities:
        if pa.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
            running[pa.activity_type.name] = pa.last_worker_identity
    return running
