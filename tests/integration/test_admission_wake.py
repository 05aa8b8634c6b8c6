"""An ending item hands its place to the first queued item in its own write and tells only that one: on a real
Temporal dev server and real PostgreSQL. The queued item goes on without a second admission (before, each woken item
re-ran admission: a workflow task and an admission transaction more; waking more than there were places made the
extra ones re-run it only to be queued again)."""

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
        started: list[tuple[float, int]] = []
        timed_out = 0
        for n, wid in enumerate(ids):
            row = await crew.store.get_work_item(wid)
            assert row is not None
            hist = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
            markers = timers = 0
            signals: list[str] = []
            for e in hist.events:
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    signals.append(e.workflow_execution_signaled_event_attributes.signal_name)
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    started.append((e.event_time.ToDatetime().timestamp(), n))
                if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                    markers += 1
                if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
                    timers += 1
            # admit and finish, each a local activity: a queued item is not admitted a second time, except by its
            # fallback timer (20 s; only a very slow machine gets there while four items run before it).
            assert markers == 2 + timers, f"item {n}: {markers} local activities, {timers} timers fired"
            timed_out += timers
            if n > 0 and timers == 0:
                # Its place was handed on by the item before it, which told it once (the old code signalled and it
                # re-admitted; before that, an ending item woke up to three).
                events = await crew.store.list_events(wid)
                handed = [e for e in events if e.data.get("state") == "admitted"]
                assert len(handed) == 1 and handed[0].data["writer"].startswith("hand_off from "), handed
                assert signals == ["admitted"], signals
        assert timed_out <= 1, f"{timed_out} fallback timers fired: the hand-off did not reach the queued items"
        assert [n for _t, n in sorted(started)] == list(range(len(ids))), "admitted out of submission order"
