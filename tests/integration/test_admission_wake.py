"""An ending item wakes only as many queued items as there are free places: on a real Temporal dev server and real
PostgreSQL. Waking more made the extra ones re-run admission only to be queued again (a workflow task and an
admission transaction each)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from crewwork.temporal.devserver import DevServer
from tests.conftest import make_settings, running_crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def test_one_free_place_wakes_one_queued_item_first_come_first_served(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url, tenant_max_in_flight=1)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        spec = {
            "kind": "task",
            "input": {},
            "agent": {"name": "scripted", "config": {"output": {"ok": True}, "delay_s": 0.5}},
        }
        ids = []
        for _ in range(5):
            # Each item asks for admission before the next is submitted: two back-to-back submissions may otherwise
            # reach admission in either order (their first workflow tasks race), and the queue is first come first
            # served among the items that asked.
            ids.append(await crew.submit(spec))
            for _poll in range(200):
                if any(e.type == "state_changed" for e in await crew.store.list_events(ids[-1])):
                    break
                await asyncio.sleep(0.05)
        for wid in ids:
            assert (await crew.result(wid)).state == "succeeded"
        signals = 0
        started: list[tuple[float, int]] = []
        for n, wid in enumerate(ids):
            row = await crew.store.get_work_item(wid)
            assert row is not None
            hist = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
            for e in hist.events:
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    signals += 1
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    started.append((e.event_time.ToDatetime().timestamp(), n))
        # Five items end, each freeing the one place: at most one wake each (the old code woke up to three).
        assert signals <= len(ids), f"{signals} slot_freed signals for {len(ids)} items ending"
        assert [n for _t, n in sorted(started)] == list(range(len(ids))), "admitted out of submission order"
