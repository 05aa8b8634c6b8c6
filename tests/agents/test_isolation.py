"""The agent pool's child processes (crewwork.agents.isolation), without Temporal: results and agent errors come back
and the child is reused; a cancel kills a child whatever its code does; a child that exits is an infrastructure
error, not the parent's death. Real child processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from crewwork.agents.base import AgentContext, AgentError
from crewwork.agents.isolation import KILL_GRACE_S, AgentProcessDied, AgentProcesses, call_for
from crewwork.agents.zygote import zygote
from crewwork.models import WorkItemKind


def ctx(config: dict[str, Any], beats: list[Any] | None = None) -> AgentContext:
    return AgentContext(
        work_item_id="wi_iso",
        attempt=1,
        activity_attempt=1,
        kind=WorkItemKind.task,
        config=config,
        heartbeat=(lambda *d: beats.append(d)) if beats is not None else (lambda *d: None),
        extra={"test_faults": True},  # as the worker passes CREWWORK_TEST_FAULTS (the faults are this test's tools)
    )


async def run(pool: AgentProcesses, config: dict[str, Any], beats: list[Any] | None = None) -> Any:
    c = ctx(config, beats)
    return await pool.run(call_for("scripted", "*", c), c)


async def test_results_and_agent_errors_come_back_and_the_child_is_reused() -> None:
    pool = AgentProcesses(1)
    try:
        beats: list[Any] = []
        assert (await run(pool, {"output": {"x": 1}, "delay_s": 1.2}, beats)).output == {"x": 1}
        assert beats, "the child's heartbeats reach the parent"
        with pytest.raises(AgentError, match="scripted error: nope"):
            await run(pool, {"error": "nope"})
        for i in range(5):
            assert (await run(pool, {"output": {"i": i}})).output == {"i": i}
        assert pool.started == 1 and pool.killed == 0
    finally:
        pool.close()


@pytest.mark.parametrize("fault", [{"block_s": 600}, {"spin_s": 600}], ids=["sleep", "busy-loop"])
async def test_cancel_kills_blocking_agent_code_within_the_grace(fault: dict[str, Any]) -> None:
    pool = AgentProcesses(1)
    try:
        # A first call waits for the child to have started (its imports take seconds on a loaded machine: a cancel
        # before it is ready kills it as never started, which is another case), then it is reused.
        assert (await run(pool, {"output": {"warm": True}})).output == {"warm": True}
        running = asyncio.create_task(run(pool, fault))
        await asyncio.sleep(2.0)  # in its blocking code by now
        assert not running.done()
        t0 = time.monotonic()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert time.monotonic() - t0 < KILL_GRACE_S + 2
        assert pool.killed == 1
        assert (await run(pool, {"output": {"after": True}})).output == {"after": True}
    finally:
        pool.close()


async def test_a_child_that_exits_is_an_infrastructure_error_and_is_replaced() -> None:
    pool = AgentProcesses(1)
    try:
        with pytest.raises(AgentProcessDied, match="code 137"):
            await run(pool, {"crash": True})
        assert (await run(pool, {"output": {"ok": 1}})).output == {"ok": 1}
    finally:
        pool.close()


def _fd_targets(pid: int, *, skip_stdio: bool = False) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        if skip_stdio and int(fd.name) <= 2:
            continue  # stdin/out/err are shared on purpose (a pipe when pytest's output is piped)
        with contextlib.suppress(OSError):
            out.add(os.readlink(fd))
    return out


async def test_a_forked_child_has_its_own_session_and_none_of_the_zygotes_descriptors() -> None:
    """Children are forked by the pool's zygote (crewwork.agents.zygote): each must be its own session (so a kill
    takes its whole group and nothing else) and must hold neither the zygote's control socket nor its wake-up pipe."""
    pool = AgentProcesses(2)
    try:
        assert (await run(pool, {"output": {"warm": True}})).output == {"warm": True}
        z = zygote()
        children = [c for c in pool._idle if c.proc.poll() is None]
        assert children, "the pool keeps warm children"
        zygote_fds = _fd_targets(z.proc.pid, skip_stdio=True)
        private = {t for t in zygote_fds if t.startswith(("socket:", "pipe:"))}
        assert private, zygote_fds
        for child in children:
            pid = child.proc.pid
            assert pid is not None and pid != z.proc.pid
            assert os.getsid(pid) == pid, "a child leads its own session"
            assert os.getpgid(pid) == pid
            leaked = private & _fd_targets(pid)
            assert not leaked, f"child {pid} holds the zygote's descriptors: {leaked}"
    finally:
        pool.close()


async def test_when_the_zygote_dies_its_running_children_die_and_the_next_child_comes_from_a_new_one() -> None:
    pool = AgentProcesses(1)
    try:
        assert (await run(pool, {"output": {"warm": True}})).output == {"warm": True}
        first = zygote()
        running = asyncio.create_task(run(pool, {"block_s": 600}))
        await asyncio.sleep(1.0)
        assert not running.done()
        os.kill(first.proc.pid, signal.SIGKILL)
        with pytest.raises(AgentProcessDied):
            await asyncio.wait_for(running, 30)
        assert (await run(pool, {"output": {"after": True}})).output == {"after": True}
        assert zygote() is not first and zygote().proc.poll() is None
    finally:
        pool.close()
