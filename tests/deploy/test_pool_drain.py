"""Rolling restarts: a worker pool process that gets SIGTERM (what `docker compose stop`, Kubernetes and systemd
send) stops polling, lets the activity it is running finish within the grace period, and exits cleanly; an activity
that outlives the grace period is handed back and completes on the replacement. Real processes, real Temporal dev
server, real PostgreSQL."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from crewwork.config import Settings
from crewwork.workers.pools import GRACEFUL_SHUTDOWN
from tests.conftest import make_settings, running_crew
from tests.deploy.procs import PoolProcesses, activity_identities, pending_activity_workers

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


def slow_task(delay_s: float) -> dict[str, Any]:
    return {"kind": "task", "input": {"q": 1}, "agent": {"config": {"output": {"a": 1}, "delay_s": delay_s}}}


async def wait_running(client: Any, workflow_id: str, activity: str, identity: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await pending_activity_workers(client, workflow_id)).get(activity) == identity:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{activity} never started on {identity}")


async def wait_exit(procs: PoolProcesses, name: str, timeout_s: float) -> int:
    p = next(p for p in procs.procs if p.name == name)
    assert p.proc is not None
    deadline = time.monotonic() + timeout_s
    while p.proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    code = p.proc.poll()
    assert code is not None, f"{name} did not exit within {timeout_s}s after SIGTERM:\n{procs.log(p)}"
    return code


@pytest.fixture
def settings(tmp_path: Path, temporal_server: Any, pg_url: str, sandbox_backend: str) -> Settings:
    return make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend)


async def test_sigterm_lets_the_running_agent_activity_finish_then_exits_cleanly(
    settings: Settings, tmp_path: Path
) -> None:
    procs = PoolProcesses(settings, tmp_path / "logs")
    try:
        procs.start("control")
        [old] = procs.start("agent")
        async with running_crew(settings, pools=()) as crew:
            wid = await crew.submit(slow_task(delay_s=4))
            row = await crew.store.get_work_item(wid)
            assert row is not None
            await wait_running(crew.client, row.workflow_id, "run_agent", procs.identity(old))

            procs.kill(old, signal.SIGTERM)
            procs.start("agent")  # the replacement of a rolling restart

            result = await crew.result(wid)
            assert result.state == "succeeded", result.reason
            assert result.output == {"a": 1}
            assert await wait_exit(procs, old.name, GRACEFUL_SHUTDOWN.total_seconds() + 30) == 0, procs.log(old)
            assert "drained" in procs.log(old)
            # The draining process itself completed the activity, on its first attempt: nothing was redone.
            ran = await activity_identities(crew.client, row.workflow_id)
            assert ran["run_agent"] == [(1, procs.identity(old))], (ran, procs.log(old)[-3000:])
    finally:
        procs.stop_all()


async def test_activity_outliving_the_grace_period_is_handed_back_and_completes_on_the_replacement(
    settings: Settings, tmp_path: Path
) -> None:
    procs = PoolProcesses(settings, tmp_path / "logs")
    try:
        procs.start("control")
        [old] = procs.start("agent")
        async with running_crew(settings, pools=()) as crew:
            # A step far longer than the grace period: the draining worker must give it up, not wait for it.
            wid = await crew.submit(slow_task(delay_s=GRACEFUL_SHUTDOWN.total_seconds() + 15))
            row = await crew.store.get_work_item(wid)
            assert row is not None
            await wait_running(crew.client, row.workflow_id, "run_agent", procs.identity(old))

            procs.kill(old, signal.SIGTERM)
            [new] = procs.start("agent")
            assert await wait_exit(procs, old.name, GRACEFUL_SHUTDOWN.total_seconds() + 15) == 0

            result = await crew.result(wid, timeout_s=180)
            assert result.state == "succeeded", result.reason
            ran = await activity_identities(crew.client, row.workflow_id)
            # Only completed starts are in history: the one that finished ran on the replacement, as a retry.
            [(attempt, identity)] = ran["run_agent"]
            assert identity == procs.identity(new) and attempt >= 2
            events = [e.type for e in await crew.store.list_events(wid)]
            assert events.count("agent_finished") == 1, events
    finally:
        procs.stop_all()
