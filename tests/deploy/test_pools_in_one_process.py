"""Several pools in one process (`crewwork worker --pool control,agent`): both task queues are served by that one
process (one Temporal client, one store pool), an item runs through it end to end, and SIGTERM drains both."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_settings, running_crew
from tests.deploy.procs import PoolProcesses, activity_identities

pytestmark = [pytest.mark.postgres, pytest.mark.temporal]


async def test_control_and_agent_in_one_process_run_items_and_drain_together(
    tmp_path: Path, temporal_server: Any, pg_url: str
) -> None:
    settings = make_settings(tmp_path, temporal_server, pg_url)
    procs = PoolProcesses(settings, tmp_path / "logs")
    try:
        [both] = procs.start("control,agent")
        log = procs.log(both)
        assert "pool control polling" in log and "pool agent polling" in log, log
        async with running_crew(settings, pools=()) as crew:
            spec = {
                "kind": "task",
                "input": {},
                "agent": {"name": "scripted", "config": {"output": {"ok": True}, "delay_s": 0.2}},
            }
            ids = [await crew.submit(spec) for _ in range(3)]
            results = [await crew.result(w, timeout_s=120) for w in ids]
            assert [r.state for r in results] == ["succeeded"] * 3, [(r.state, r.reason) for r in results]
            ident = procs.identity(both)
            for w in ids:
                row = await crew.store.get_work_item(w)
                assert row is not None
                ran = await activity_identities(crew.client, row.workflow_id)
                assert {i for _a, i in ran["run_agent"]} == {ident}, ran
                assert {i for _a, i in ran["workflow_task"]} == {ident}, ran
        assert both.proc is not None
        both.restart = False
        both.proc.send_signal(signal.SIGTERM)
        assert both.proc.wait(60) == 0, procs.log(both)
        log = procs.log(both)
        assert "pool control drained" in log and "pool agent drained" in log, log
    finally:
        procs.stop_all()
