"""Determinism: committed histories of WorkItemWorkflow must replay against the current workflow code.

If this fails, a workflow change altered the command sequence of in-flight executions: guard it with
`workflow.patched()` (see docs/operations.md) instead of changing the code in place. To record a new history
after an intentional, versioned change: CREWWORK_RECORD_HISTORY=1 pytest tests/integration/test_replay.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from crewwork.demo import RIGHT, WRONG
from crewwork.models import ReviewDecision
from crewwork.workflows.work_item import WorkItemWorkflow
from tests.conftest import Crew
from tests.integration.test_lifecycle import code_change

HISTORIES = Path(__file__).parent.parent / "histories"


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.name)
async def test_committed_histories_replay_deterministically(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[WorkItemWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


def test_there_is_a_committed_history() -> None:
    assert len(list(HISTORIES.glob("*.json"))) >= 4


def _version() -> str:
    """CREWWORK_RECORD_HISTORY=v2 records *_v2.json; any other non-empty value records v1."""
    value = os.environ.get("CREWWORK_RECORD_HISTORY", "")
    return value if value.startswith("v") else "v1"


async def _record_histories(crew: Crew, calc_repo: Path) -> None:  # pragma: no cover - a tool, not a check
    wid = await crew.submit(
        code_change(
            calc_repo,
            [{"files": {"calc.py": WRONG}}, {"files": {"calc.py": RIGHT}}],
            review={"required": True},
        )
    )
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="approve"))
    await crew.result(wid)
    hist = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
    (HISTORIES / f"code_change_repair_review_{_version()}.json").write_text(hist.to_json())
    wid = await crew.submit({"kind": "task", "input": {"q": 1}, "agent": {"config": {"output": {"a": 1}}}})
    await crew.result(wid)
    row = await crew.store.get_work_item(wid)
    assert row is not None
    hist = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
    (HISTORIES / f"task_{_version()}.json").write_text(hist.to_json())


if os.environ.get("CREWWORK_RECORD_HISTORY"):  # defined only on request, so normal runs skip nothing

    async def test_record_histories(crew: Crew, calc_repo: Path) -> None:
        await _record_histories(crew, calc_repo)
