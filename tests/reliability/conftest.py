"""Fixtures of the fault-injection suite: worker pools as real subprocesses under the stack's restart supervision."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from crewwork.cli.stack import ManagedProcess, Stack
from crewwork.config import Settings
from crewwork.workers.pools import POOLS


def pool_env(settings: Settings, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env.update(
        {
            "CREWWORK_DATA_DIR": str(settings.data_dir),
            "CREWWORK_DATABASE_URL": settings.resolved_database_url(),
            "CREWWORK_TEMPORAL_ADDRESS": settings.temporal_address,
            "CREWWORK_TASK_QUEUE_PREFIX": settings.task_queue_prefix,
            "CREWWORK_LEASE_TTL_S": str(settings.lease_ttl_s),
            "CREWWORK_REPO_ALLOW_NETWORKS": settings.repo_allow_networks,
            "CREWWORK_DB_POOL_SIZE": "4",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if settings.sandbox.backend:
        env["CREWWORK_SANDBOX_BACKEND"] = settings.sandbox.backend
    env.update(extra)
    return env


@contextlib.contextmanager
def pool_processes(settings: Settings, counts: dict[str, int] | None = None, **extra_env: str) -> Iterator[Stack]:
    """`crewwork worker --pool NAME` processes, supervised (restarted when they die) by crewwork.cli.stack's supervisor.

    Yields the Stack holding them; `stack.kill(name)` sends a signal to one of them (e.g. "agent-0")."""
    counts = counts or dict.fromkeys(POOLS, 1)
    logs = settings.data_dir / "logs"
    stack = Stack(data_dir=settings.data_dir, ui=False)
    env = pool_env(settings, **extra_env)
    for pool, n in counts.items():
        for i in range(n):
            stack.processes.append(
                ManagedProcess(
                    f"{pool}-{i}",
                    [sys.executable, "-m", "crewwork", "worker", "--pool", pool],
                    env,
                    logs / f"worker-{pool}-{i}-{uuid.uuid4().hex[:4]}.log",
                )
            )
    for p in stack.processes:
        p.start()
    stack._supervisor = threading.Thread(target=stack._supervise, daemon=True)
    stack._supervisor.start()
    try:
        wait_polling(stack.processes)
        yield stack
    finally:
        stack.stop()


def wait_polling(processes: list[ManagedProcess], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(processes)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if "polling" not in _read(p.log_path)]
        time.sleep(0.1)
    if pending:
        raise RuntimeError(
            "pool processes did not start: " + "; ".join(f"{p.name}: {_read(p.log_path)[-2000:]}" for p in pending)
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def holding_pool(
    settings: Settings, pool: str, activity: str, marker_dir: Path, **extra_env: str
) -> Iterator[ManagedProcess]:
    """One real pool process that holds attempt 1 of `activity` before its first write (tests/reliability/
    holding_worker.py), with a single slot so that, while it holds, it polls for nothing else."""
    env = pool_env(
        settings,
        PYTHONPATH=str(REPO_ROOT),
        CREWWORK_AGENT_CONCURRENCY="1",
        CREWWORK_VALIDATE_CONCURRENCY="1",
        CREWWORK_CONTROL_CONCURRENCY="1",
        **extra_env,
    )
    proc = ManagedProcess(
        f"holding-{pool}",
        [sys.executable, "-m", "tests.reliability.holding_worker", pool, activity, str(marker_dir)],
        env,
        settings.data_dir / "logs" / f"holding-{pool}-{uuid.uuid4().hex[:4]}.log",
        restart=False,
    )
    proc.start()
    try:
        wait_polling([proc])
        yield proc
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            import signal

            proc.proc.send_signal(signal.SIGCONT)
        proc.stop(grace_s=10)
