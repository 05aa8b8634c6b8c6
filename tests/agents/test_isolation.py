"""The agent pool's child processes (crewwork.agents.isolation), without Temporal: results and agent errors come back
and the child is reused; a cancel kills a child whatever its code does; a child that exits is an infrastructure
error, not the parent's death. Real child processes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from crewwork.agents.base import AgentContext, AgentError
from crewwork.agents.isolation import KILL_GRACE_S, AgentProcessDied, AgentProcesses, call_for
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
