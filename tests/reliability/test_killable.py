"""Agent and validation work is killable: whatever the agent code does (blocks the event loop, spins, is a zombie
that ignores cancellation, exits the process), cancelling its item frees the slot within seconds and no other item
is hurt. One agent slot and one validate slot, so a slot that is not freed blocks the next item outright.

Real Temporal dev server, real PostgreSQL, real bubblewrap and Docker sandboxes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from crewwork.cli.demo import RIGHT
from crewwork.temporal.devserver import DevServer
from tests.conftest import Crew, make_settings, running_crew
from tests.reliability.test_faults import agent_tries, calc, code_change, terminal, until

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

SLOT_FREED_WITHIN_S = 15.0
"""Cancel to the next item's success, with one slot: the cancellation's way through Temporal, the kill (a 1 s
SIGTERM grace) and the next item's own run. Measured at 3-6 s here (bench/flood.py prints the figure)."""


async def ended(crew: Crew, wid: str, timeout_s: float = 60) -> Any:
    """The item's row once its final state and result are stored (a cancelled workflow has no result to wait on)."""

    async def probe() -> Any:
        row = await crew.store.get_work_item(wid)
        return row if row is not None and row.result is not None else None

    return await until(f"{wid} to end", probe, timeout_s)


def task(config: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "task", "input": {}, "agent": {"name": "scripted", "config": config}}


async def one_slot_crew(tmp_path: Path, temporal: DevServer, pg_url: str, backend: str, **kw: Any) -> Any:
    settings = make_settings(
        tmp_path, temporal, pg_url, sandbox_backend=backend, agent_concurrency=1, validate_concurrency=1, **kw
    )
    return running_crew(settings)


async def cancel_and_time_next(crew: Crew, wid: str, nxt: dict[str, Any]) -> float:
    row = await crew.store.get_work_item(wid)
    assert row is not None
    t0 = time.monotonic()
    await crew.service.cancel(row)
    other = await crew.submit(nxt)
    done = await terminal(crew, other, timeout_s=60)
    took = time.monotonic() - t0
    assert done.state == "succeeded", done.reason
    assert (await ended(crew, wid, timeout_s=30)).state == "cancelled"
    return took


@pytest.mark.parametrize(
    "fault",
    [
        {"block_s": 600},  # a synchronous time.sleep on the agent's event loop
        {"spin_s": 600},  # a busy loop
        {"stall_s": 600},  # a zombie: stops heartbeating, blocks in a thread, swallows cancellation
    ],
    ids=["blocking-sleep", "busy-loop", "zombie-ignoring-cancellation"],
)
async def test_cancelling_blocking_agent_code_frees_its_slot_within_seconds(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str, fault: dict[str, Any]
) -> None:
    async with await one_slot_crew(tmp_path, temporal_server, pg_url, sandbox_backend) as crew:
        wid = await crew.submit(task(fault))

        async def agent_running() -> bool:
            return bool(await agent_tries(crew.store, wid))

        await until("the agent to start", agent_running, timeout_s=60)
        took = await cancel_and_time_next(crew, wid, task({"output": {"ok": True}}))
        assert took <= SLOT_FREED_WITHIN_S, f"the slot came back {took:.1f}s after the cancel"


async def test_an_agent_that_exits_its_process_hurts_no_other_item(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, sandbox_backend: str
) -> None:
    """`os._exit` in agent code kills only the child running it: the attempt is retried, and an item running beside
    it in the same pool (two slots) finishes on its first try."""
    settings = make_settings(tmp_path, temporal_server, pg_url, sandbox_backend=sandbox_backend, agent_concurrency=2)
    async with running_crew(settings) as crew:
        bystander = await crew.submit(task({"delay_s": 4, "output": {"me": "bystander"}}))

        async def bystander_running() -> bool:
            return bool(await agent_tries(crew.store, bystander))

        await until("the bystander to start", bystander_running, timeout_s=60)
        crashers = [await crew.submit(task({"crash": True, "output": {"n": i}})) for i in range(3)]
        row = await terminal(crew, bystander, timeout_s=90)
        assert row.state == "succeeded", row.reason
        assert await agent_tries(crew.store, bystander) == [1], "the bystander's attempt was never interrupted"
        for wid in crashers:
            done = await terminal(crew, wid, timeout_s=90)
            assert done.state == "succeeded", done.reason
            assert await agent_tries(crew.store, wid) == [1, 2]  # the crash fires on Temporal attempt 1 only


def _sandbox_processes(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def _containers() -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-q", "--filter", "label=crewwork.sandbox"], capture_output=True, text=True, check=False
    )
    return out.stdout.split()


# With docker, "nothing left" is checked over every sandbox container on the engine: a parallel worker's containers
# would make it ambiguous, so that case runs in the `alone` pass (scripts/run-tests.sh).
@pytest.mark.parametrize("backend", ["bwrap", pytest.param("docker", marks=pytest.mark.alone)])
async def test_cancelling_a_validation_kills_its_whole_sandbox_and_frees_the_slot(
    tmp_path: Path, temporal_server: DevServer, pg_url: str, backend: str
) -> None:
    from crewwork.sandbox.backends import get_sandbox

    try:
        get_sandbox(backend)
    except Exception as exc:
        pytest.skip(f"{backend} sandbox unavailable: {exc}")
    if backend == "docker" and _containers():
        pytest.skip("other sandbox containers are running on this engine; the leftover check would be ambiguous")
    marker = f"{600 + int(time.time()) % 300}.{time.time_ns() % 1000}"
    repo = calc(tmp_path / "repo")
    # The validation command starts a process tree (a shell, a background child, a foreground sleep) that never ends.
    hang = {
        "command": ["sh", "-c", f"sleep {marker} & sleep {marker}; wait"],
        "timeout_s": 900,
    }
    async with await one_slot_crew(tmp_path, temporal_server, pg_url, backend) as crew:
        wid = await crew.submit(code_change(repo, {"files": {"calc.py": RIGHT}}, validation=hang))
        await crew.wait_state(wid, "validating", timeout_s=90)

        async def sandbox_started() -> bool:
            return bool(_sandbox_processes(f"sleep {marker}"))

        await until("the validation's processes", sandbox_started, timeout_s=60)
        t0 = time.monotonic()
        row = await crew.store.get_work_item(wid)
        assert row is not None
        await crew.service.cancel(row)
        assert (await ended(crew, wid, timeout_s=60)).state == "cancelled"

        async def sandbox_gone() -> bool:
            return not _sandbox_processes(f"sleep {marker}") and (backend != "docker" or not _containers())

        await until("the sandbox to be killed", sandbox_gone, timeout_s=SLOT_FREED_WITHIN_S)
        killed_after = time.monotonic() - t0
        # The validate slot is free: the next item validates (one slot) and succeeds.
        nxt = await crew.submit(code_change(calc(tmp_path / "next"), {"files": {"calc.py": RIGHT}}))
        done = await terminal(crew, nxt, timeout_s=120)
        assert done.state == "succeeded", done.reason
        assert killed_after <= SLOT_FREED_WITHIN_S
