"""Determinism: committed histories of WorkItemWorkflow must replay against the current workflow code.

If this fails, a workflow change altered the command sequence of in-flight executions: guard it with
`workflow.patched()` (see docs/operations.md) instead of changing the code in place. To record new histories after
an intentional, versioned change: CREWWORK_RECORD_HISTORY=v2 pytest tests/integration/test_replay.py -k record
(crewwork 0.1.0 is unreleased, so the baseline histories are `*_v1.json`, recorded from the code as it is).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from crewwork.config import Settings
from crewwork.demo import RIGHT, WRONG
from crewwork.models import ReviewDecision
from crewwork.workflows.work_item import WorkItemWorkflow
from tests.conftest import Crew, running_crew
from tests.integration.test_lifecycle import code_change

HISTORIES = Path(__file__).parent.parent / "histories"


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.name)
async def test_committed_histories_replay_deterministically(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[WorkItemWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


def test_there_is_a_committed_history() -> None:
    assert len(list(HISTORIES.glob("*.json"))) >= 5


def _version() -> str:
    """CREWWORK_RECORD_HISTORY=v2 records *_v2.json; any other non-empty value records v1."""
    value = os.environ.get("CREWWORK_RECORD_HISTORY", "")
    return value if value.startswith("v") else "v1"


async def _save(crew: Crew, wid: str, name: str) -> None:
    row = await crew.store.get_work_item(wid)
    assert row is not None
    hist = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
    (HISTORIES / f"{name}_{_version()}.json").write_text(hist.to_json())


async def _record_histories(crew: Crew, calc_repo: Path) -> None:  # pragma: no cover - a tool, not a check
    # A repair loop: attempt 1 fails validation, attempt 2 passes, a reviewer approves, the change lands.
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
    await _save(crew, wid, "code_change_repair_review")
    # A reviewer asks for changes; the next attempt passes and is approved.
    wid = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True}))
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="request_changes", comment="also add a docstring"))
    await crew.wait_attempts(wid, 2)
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="approve"))
    await crew.result(wid)
    await _save(crew, wid, "code_change_request_changes")
    # A task, and a task cancelled while its agent runs.
    wid = await crew.submit({"kind": "task", "input": {"q": 1}, "agent": {"config": {"output": {"a": 1}}}})
    await crew.result(wid)
    await _save(crew, wid, "task")
    wid = await crew.submit({"kind": "task", "input": {}, "agent": {"config": {"delay_s": 30}}})
    row = await crew.wait_state(wid, "running")
    await crew.service.cancel(row)
    with contextlib.suppress(Exception):
        await crew.result(wid)
    await _save(crew, wid, "task_cancelled")


async def _record_queued(settings: Settings, *, admit_at_submission: bool) -> None:  # pragma: no cover - a tool
    """A task that waits in `queued` behind its tenant's in-flight limit of 1, then runs: the ending item hands it its
    place. `admit_at_submission=False` (task_handed_off): its workflow started at once, queued itself and got the
    `admitted` signal. True (crewwork/starts.py): the first task is admitted at submission
    (task_admitted_at_submission), and the second has no workflow until the hand-off starts it admitted, with the
    signal (task_started_by_hand_off). task_queued_v1.json was recorded before the hand-off: it was woken by
    `slot_freed` and re-ran admission; it stays, since such executions may be in flight at an upgrade."""
    own = {
        "tenant_max_in_flight": 1,
        "task_queue_prefix": settings.task_queue_prefix + ("a" if admit_at_submission else "q"),
        "admit_at_submission": admit_at_submission,
    }
    async with running_crew(settings.model_copy(update=own)) as crew:
        first = await crew.submit({"kind": "task", "input": {}, "agent": {"config": {"delay_s": 2}}})
        await crew.wait_state(first, "running")
        second = await crew.submit({"kind": "task", "input": {}, "agent": {"config": {"output": {"a": 2}}}})
        await crew.wait_state(second, "queued")
        await crew.result(second)
        if admit_at_submission:
            await _save(crew, first, "task_admitted_at_submission")
            await _save(crew, second, "task_started_by_hand_off")
        else:
            await _save(crew, second, "task_handed_off")


if os.environ.get("CREWWORK_RECORD_HISTORY"):  # defined only on request, so normal runs skip nothing

    async def test_record_histories(crew: Crew, calc_repo: Path) -> None:
        await _record_histories(crew, calc_repo)
        await _record_queued(crew.settings, admit_at_submission=False)

    async def test_record_started_admitted(crew: Crew) -> None:
        # Alone: `-k record_started_admitted` (the histories above stay as they were recorded).
        await _record_queued(crew.settings, admit_at_submission=True)
