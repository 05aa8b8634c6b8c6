"""An ending item hands its place to the first queued item in its own write and starts only that one's workflow,
admitted: on a real Temporal dev server and real PostgreSQL. Admission is decided at submission, so a queued item has
no workflow while it waits and its workflow asks for no admission when it starts (before, each queued workflow asked,
waited on a timer and took a signal and a workflow task more; earlier still, each woken item re-ran admission)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError, RPCStatusCode

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
        ids = [await crew.submit(spec) for _ in range(5)]
        # Admission is decided in the submission's request (crewwork/admission/starts.py): the first is admitted and its
        # workflow started; the others are queued, first come first served, and have no workflow yet.
        first = await crew.store.get_work_item(ids[0])
        assert first is not None and first.state in ("admitted", "running", "succeeded"), first.state
        last = await crew.store.get_work_item(ids[-1])
        assert last is not None and last.state == "queued", last.state
        with pytest.raises(RPCError) as err:
            await crew.client.get_workflow_handle(last.workflow_id).describe()
        assert err.value.status == RPCStatusCode.NOT_FOUND
        for wid in ids:
            assert (await crew.result(wid)).state == "succeeded"
        started: list[tuple[float, int]] = []
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
            # Started admitted: no admit step (only finish, a local activity), no queue timer.
            assert (markers, timers) == (1, 0), f"item {n}: {markers} local activities, {timers} timers fired"
            events = await crew.store.list_events(wid)
            admissions = [e for e in events if e.data.get("state") == "admitted"]
            assert len(admissions) == 1, admissions
            if n == 0:
                assert admissions[0].data["writer"] == "admission" and signals == [], (admissions, signals)
            else:
                # Its place was handed on by the item before it, in that item's write, which started its workflow
                # admitted: no signal in its history (a plain start; only a workflow already running is signalled).
                assert next(e.data["state"] for e in events if e.type == "state_changed") == "queued"
                assert admissions[0].data["writer"].startswith("hand_off from "), admissions
                assert signals == [], signals
        assert [n for _t, n in sorted(started)] == list(range(len(ids))), "admitted out of submission order"
