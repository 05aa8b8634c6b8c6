"""Determinism: committed histories of WorkItemWorkflow must replay against the current workflow code.

If this fails, a workflow change altered the command sequence of in-flight executions: guard it with
`workflow.patched()` (see docs/operations.md) instead of changing the code in place. To record new histories after
an intentional, versioned change: CREWWORK_RECORD_HISTORY=v2 pytest tests/integration/test_replay.py -k record
(crewwork 0.1.0 is unreleased, so the baseline histories are `*_v1.json`, recorded from the code as it is).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from crewwork.cli.demo import RIGHT, WRONG
from crewwork.config import Settings
from crewwork.models import ReviewDecision
from crewwork.workflows.work_item import (
    LEAN_END,
    READMIT_AFTER_REVIEW,
    REVIEW_RECORDED,
    SUBMISSION_FAULT_ENDS_ITEM,
    WorkItemWorkflow,
)
from tests.conftest import Crew, running_crew
from tests.integration.test_lifecycle import VALIDATION, code_change

HISTORIES = Path(__file__).parent.parent / "histories"
WORKFLOW_SOURCES = Path(__file__).parents[2] / "crewwork" / "workflows"

PATCHES = {
    # patch id: (a history from before it, which takes the old branch; a history with its marker, the new branch)
    READMIT_AFTER_REVIEW: ("code_change_request_changes_v1.json", "code_change_request_changes_v2.json"),
    SUBMISSION_FAULT_ENDS_ITEM: ("code_change_missing_command_v1.json", "code_change_missing_command_v2.json"),
    REVIEW_RECORDED: ("code_change_request_changes_v2.json", "code_change_review_recorded_v3.json"),
    LEAN_END: ("code_change_review_recorded_v3.json", "code_change_review_recorded_v4.json"),
}
"""Every `workflow.patched` branch still in the workflow code, with the two committed histories that keep both of its
branches replaying. docs/upgrading.md, "Retiring a patch", says when and how a row leaves this table."""


def _patch_markers(path: Path) -> set[str]:
    history = json.loads(path.read_text())
    found = set()
    for event in history["events"]:
        attrs = event.get("markerRecordedEventAttributes")
        if attrs and attrs.get("markerName") == "core_patch":
            for payload in attrs["details"]["patch-data"]["payloads"]:
                found.add(json.loads(base64.b64decode(payload["data"]))["id"])
    return found


def test_every_patch_in_the_workflow_code_has_a_history_of_each_branch() -> None:
    in_code = set()
    for source in WORKFLOW_SOURCES.glob("*.py"):
        in_code |= set(re.findall(r"workflow\.(?:patched|deprecate_patch)\(([A-Z_]+)\)", source.read_text()))
    import crewwork.workflows.work_item as wi

    assert {getattr(wi, name) for name in in_code} == set(PATCHES), "a patch without histories of both its branches"
    for patch_id, (before, after) in PATCHES.items():
        assert patch_id not in _patch_markers(HISTORIES / before), f"{before} must come from before {patch_id}"
        assert patch_id in _patch_markers(HISTORIES / after), f"{after} must take {patch_id}'s new branch"


async def test_a_history_from_before_a_patch_does_not_replay_when_the_patch_is_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the replay tests catch: taking a patch's new branch unconditionally (removing the patch before its
    executions are gone) breaks the histories from before it. One patch at a time: a history from before one patch
    may hold the markers of older ones, and forcing those too would fail it for their sake, not this patch's."""
    from temporalio import workflow
    from temporalio.workflow import NondeterminismError

    real = workflow.patched
    for patch_id, (before, _after) in PATCHES.items():
        monkeypatch.setattr(workflow, "patched", lambda p, forced=patch_id: True if p == forced else real(p))
        path = HISTORIES / before
        history = WorkflowHistory.from_json(path.stem, path.read_text())
        replayer = Replayer(
            workflows=[WorkItemWorkflow],
            data_converter=pydantic_data_converter,
            workflow_runner=UnsandboxedWorkflowRunner(),
        )
        # Either the commands differ (a nondeterminism error) or the old branch's activity result no longer decodes
        # as the new branch's type (REVIEW_RECORDED: a bool where a WriteOutcome is read): both fail the task.
        with pytest.raises((NondeterminismError, RuntimeError)) as failed:
            await replayer.replay_workflow(history)
        assert isinstance(failed.value, NondeterminismError) or "Failed decoding arguments" in str(failed.value)


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
    `admitted` signal. True (crewwork/admission/starts.py): the first task is admitted at submission
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


async def _record_reviews(crew: Crew, calc_repo: Path) -> None:  # pragma: no cover - a tool, not a check
    """Decisions recorded as the item's facts (patch `review-recorded`): changes requested with a line comment on
    attempt 1, attempt 2 approved by name (code_change_review_recorded); and a rejection with its reason
    (code_change_rejected). Recorded with CREWWORK_RECORD_HISTORY=v3 ... -k record_reviews, and again with v4 after
    the patch `lean-end`."""
    from crewwork.models import LineComment

    steps = [{"files": {"calc.py": RIGHT}}, {"files": {"calc.py": RIGHT.replace("a + b", "b + a")}}]
    wid = await crew.submit(code_change(calc_repo, steps, review={"required": True}))
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(
        row,
        ReviewDecision(
            action="request_changes",
            attempt=1,
            comment="swap the operands",
            reviewer="bob",
            line_comments=[LineComment(path="calc.py", line=2, body="b + a, please")],
        ),
    )
    await crew.wait_attempts(wid, 2)
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="approve", attempt=2, reviewer="alice", comment="LGTM"))
    await crew.result(wid)
    await _save(crew, wid, "code_change_review_recorded")
    wid = await crew.submit(code_change(calc_repo, [{"files": {"calc.py": RIGHT}}], review={"required": True}))
    row = await crew.wait_state(wid, "awaiting_review")
    await crew.service.review(row, ReviewDecision(action="reject", attempt=1, comment="not this way"))
    await crew.result(wid)
    await _save(crew, wid, "code_change_rejected")


async def _record_missing_command(
    crew: Crew, calc_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # pragma: no cover
    """A code change whose test command does not exist: with SUBMISSION_FAULT_ENDS_ITEM (v2) it ends after attempt 1;
    recorded with the patch answered False (v1), it runs on to its budget, as every release before the patch did
    (the workflow code's other branch is that release's code)."""
    from temporalio import workflow

    item = code_change(
        calc_repo,
        [{"files": {"calc.py": "x = 1\n"}}, {"files": {"calc.py": "x = 2\n"}}],
        validation={**VALIDATION, "command": ["crewwork-no-such-test-runner"]},
        budget={"max_attempts": 2},
    )
    wid = await crew.submit(item)
    await crew.result(wid)
    await _save_as(crew, wid, "code_change_missing_command_v2")
    real = workflow.patched
    monkeypatch.setattr(workflow, "patched", lambda p: False if p == SUBMISSION_FAULT_ENDS_ITEM else real(p))
    wid = await crew.submit(item)
    await crew.result(wid)
    await _save_as(crew, wid, "code_change_missing_command_v1")


async def _record_pr_review(crew: Crew, calc_repo: Path) -> None:  # pragma: no cover - a tool, not a check
    """A pull request's review (kind `pr_review`): attempt 1's review is not valid (an unknown field), attempt 2's is
    the item's output. Recorded with CREWWORK_RECORD_HISTORY=v4 ... -k record_pr_review (the workflow as of the
    `lean-end` patch; `_v1` names histories from before every patch, tests/deploy/test_workflow_versioning.py)."""
    review = {"body": "ok", "comments": [{"path": "calc.py", "line": 2, "body": "adds"}]}
    item = {
        "kind": "pr_review",
        "repo": {"url": str(calc_repo), "ref": "main"},
        "instruction": "Review the change",
        "agent": {
            "name": "scripted",
            "config": {
                "attempts": [
                    {"files": {"crewwork-review.json": json.dumps({"body": "x", "verdict": "APPROVE"})}},
                    {"files": {"crewwork-review.json": json.dumps(review)}},
                ]
            },
        },
        "budget": {"max_attempts": 2},
    }
    wid = await crew.submit(item)
    result = await crew.result(wid)
    assert result.state == "succeeded" and result.output == {
        "review": {**review, "comments": [{**review["comments"][0], "side": "RIGHT"}]}
    }, result
    await _save(crew, wid, "pr_review")


async def _save_as(crew: Crew, wid: str, stem: str) -> None:
    row = await crew.store.get_work_item(wid)
    assert row is not None
    hist = await crew.client.get_workflow_handle(row.workflow_id).fetch_history()
    (HISTORIES / f"{stem}.json").write_text(hist.to_json())


if os.environ.get("CREWWORK_RECORD_HISTORY"):  # defined only on request, so normal runs skip nothing

    async def test_record_missing_command(crew: Crew, calc_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        # Alone: `-k record_missing_command`.
        await _record_missing_command(crew, calc_repo, monkeypatch)

    async def test_record_histories(crew: Crew, calc_repo: Path) -> None:
        await _record_histories(crew, calc_repo)
        await _record_queued(crew.settings, admit_at_submission=False)

    async def test_record_reviews(crew: Crew, calc_repo: Path) -> None:
        # Alone: `-k record_reviews` (the histories above stay as they were recorded).
        await _record_reviews(crew, calc_repo)

    async def test_record_pr_review(crew: Crew, calc_repo: Path) -> None:
        # Alone: `-k record_pr_review`.
        await _record_pr_review(crew, calc_repo)

    async def test_record_started_admitted(crew: Crew) -> None:
        # Alone: `-k record_started_admitted` (the histories above stay as they were recorded).
        await _record_queued(crew.settings, admit_at_submission=True)
