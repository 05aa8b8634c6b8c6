"""An agent slot polls for its next task while the attempt finishes (crewwork/workers/slots.py), and the attempt's
transcript is inserted by its last fenced write: on a real Temporal dev server and real PostgreSQL."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio.api.enums.v1 import EventType

from crewwork.store.tables import Artifact, Event
from crewwork.temporal.devserver import DevServer
from tests.conftest import make_settings, running_crew

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]

AGENT_S = 0.3


def _task(i: int) -> dict:
    return {
        "kind": "task",
        "instruction": f"item {i}",
        "input": {"n": i},
        "agent": {"name": "scripted", "config": {"output": {"ok": True}, "delay_s": AGENT_S}},
    }


async def test_one_slot_polls_ahead_but_runs_one_agent_at_a_time(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url, agent_concurrency=1)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        ids = [await crew.submit(_task(i)) for i in range(6)]
        for wid in ids:
            res = await crew.result(wid)
            assert res.state == "succeeded", res.reason
        runs = []
        for wid in ids:
            row = await crew.store.get_work_item(wid)
            assert row is not None
            hist = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
            t = {e.event_type: e.event_time.ToDatetime().timestamp() for e in hist.events}
            events = await crew.store.list_events(wid)
            running = min(
                e.created_at for e in events if e.type == "state_changed" and e.data.get("state") == "running"
            )
            finished = next(e for e in events if e.type == "agent_finished")
            runs.append(
                (
                    t[EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED],
                    t[EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED],
                    running,
                    finished,
                )
            )
            # The transcript is inserted by the attempt's last write: same transaction, same database clock.
            async with crew.store.session() as s:
                art = await s.scalar(select(Artifact).where(Artifact.id == finished.data["transcript_ref"]))
            assert art is not None and art.created_at == finished.created_at
        runs.sort()
        overlapped = sum(1 for a, b in itertools.pairwise(runs) if b[0] < a[1])
        assert overlapped >= 1, "no activity started before the previous one completed: the slot did not poll ahead"
        for a, b in itertools.pairwise(runs):
            # Still one agent at a time: the next attempt's first write comes after this one's agent ran.
            assert b[2] >= a[2] + AGENT_S, "two agents ran at once in a one-slot pool"


async def test_a_refused_last_write_stores_no_transcript(
    tmp_path: Path, temporal_server: DevServer, pg_url: str
) -> None:
    """An attempt whose last write is refused leaves no artifact behind (the transcript went with the write)."""
    from crewwork.steps.attempt import AttemptWriter
    from crewwork.store.artifacts import new_artifact
    from crewwork.store.fencing import Rank

    settings = make_settings(tmp_path, temporal_server, pg_url)
    async with running_crew(settings, pools=("control", "agent")) as crew:
        wid = await crew.submit(_task(0))
        await crew.result(wid)
        row = new_artifact(
            work_item_id=wid,
            tenant_id=crew.tenant_id,
            name="zombie.txt",
            data=b"z",
            content_type="text/plain",
            max_bytes=1024,
        )
        w = AttemptWriter(crew.store, wid, crew.tenant_id, Rank(1, 1), "run_agent#1")
        res = await w.event("agent_finished", {"transcript_ref": row.id}, [row])
        assert res.stale
        async with crew.store.session() as s:
            assert await s.scalar(select(Artifact).where(Artifact.id == row.id)) is None
            types = [e async for e in await s.stream_scalars(select(Event.type).where(Event.work_item_id == wid))]
        assert "stale_write_rejected" in types
