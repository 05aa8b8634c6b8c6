"""A mock agent's work item is labelled mock from submission on: in the API, the CLI and the console's data, while it
awaits review (exactly when a person decides on it) and after it is cancelled. Before, `mock` was false until an
attempt's result was written at landing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crewwork.cli.demo import RIGHT
from tests.api.conftest import Stack, wait_state
from tests.integration.test_lifecycle import code_change

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def _cli_status(stack: Stack, wid: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CREWWORK_")}
    env.update(CREWWORK_API_URL=stack.api.url, CREWWORK_API_KEY=stack.alpha.key)
    p = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "crewwork", "status", wid],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


async def test_a_mock_agent_is_labelled_mock_from_submission_through_review_and_cancel(
    stack: Stack, calc_repo: Path
) -> None:
    item = code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True})
    async with stack.client() as c:
        r = await c.post("/v1/work-items", json=item)
        assert r.status_code == 202, r.text
        wid = r.json()["id"]
        first = (await c.get(f"/v1/work-items/{wid}", params={"live": "false"})).json()
        assert first["mock"] is True, first["state"]

        waiting = await wait_state(c, wid, {"awaiting_review"}, timeout_s=120)
        assert waiting["mock"] is True
        listed = (await c.get("/v1/work-items", params={"state": "awaiting_review"})).json()["items"]
        assert [i["mock"] for i in listed if i["id"] == wid] == [True]
        assert "MOCK agent" in (await _cli_status(stack, wid)).splitlines()[0]

        assert (await c.post(f"/v1/work-items/{wid}/cancel")).status_code in (200, 202)
        cancelled = await wait_state(c, wid, {"cancelled"}, timeout_s=60)
        assert cancelled["mock"] is True and cancelled["result"]["mock"] is True

        # A task whose mock agent failed every attempt: its result says mock too (it said false).
        scripted = {"name": "scripted", "config": {"error": "no output"}}
        r = await c.post(
            "/v1/work-items", json={"kind": "task", "input": {}, "agent": scripted, "budget": {"max_attempts": 1}}
        )
        done = await wait_state(c, r.json()["id"], {"succeeded", "failed"})
        assert done["state"] == "failed" and done["mock"] is True and done["result"]["mock"] is True
