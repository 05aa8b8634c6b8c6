"""What the CLI says against the real API: progress stamped with when things happened, and a refused key named by
where it came from."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.api.conftest import Stack, task_item, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def _cli(stack: Stack, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    clean.update({"CREWWORK_API_URL": stack.api.url, "CREWWORK_API_KEY": stack.alpha.key, **env})
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "crewwork", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_wait_stamps_replayed_events_with_when_they_happened(stack: Stack) -> None:
    # Long enough that the CLI (a new process, slow to start on a loaded machine) connects while the item still runs:
    # `wait` on an item that already ended returns its result without replaying anything.
    slow = {**task_item(), "agent": {"name": "scripted", "config": {"output": {"x": 1}, "delay_s": 25}}}
    async with stack.client() as c:
        wid = (await c.post("/v1/work-items", json=slow)).json()["id"]
        await wait_state(c, wid, {"running"})
        await asyncio.sleep(3)  # the events so far are seconds old when `wait` replays them
        p = await _cli(stack, "wait", wid)
        assert p.returncode == 0, p.stderr
        events = (await c.get(f"/v1/work-items/{wid}/events")).json()
    happened = {time.strftime("%H:%M:%S", time.localtime(e["created_at"])) for e in events}
    stamps = re.findall(rf"^  (\d\d:\d\d:\d\d) {wid} ", p.stderr, re.M)
    assert stamps, p.stderr
    assert set(stamps) <= happened, (stamps, happened)  # before: all the time of printing


async def test_a_refused_key_says_where_the_cli_got_it(stack: Stack, tmp_path: Path) -> None:
    p = await _cli(stack, "list", CREWWORK_API_KEY="cw_notakeyanyoneissued000000")
    assert p.returncode == 3 and "401" in p.stderr and "CREWWORK_API_KEY" in p.stderr, p.stderr
    (tmp_path / "api_key").write_text("cw_notakeyanyoneissued000000\n")
    p = await _cli(stack, "list", CREWWORK_API_KEY="", CREWWORK_DATA_DIR=str(tmp_path))
    assert p.returncode == 3 and str(tmp_path / "api_key") in p.stderr, p.stderr
