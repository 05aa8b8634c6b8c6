"""Why workflow changes must be versioned before a rolling deploy (docs/operations.md, "Changing workflow code"):
the histories recorded from the previous version (tests/histories/*_v1.json) replay against a change guarded by
`workflow.patched`, and fail with a nondeterminism error against the very same change made in place. The replay is
what Temporal does on a worker of the new version when it picks up an execution started by the old one."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.deploy.versioned_workflows import PatchedWorkItemWorkflow, UnguardedWorkItemWorkflow

V1_HISTORIES = sorted((Path(__file__).parents[1] / "histories").glob("*_v1.json"))


def history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def test_there_are_histories_from_the_previous_version() -> None:
    assert len(V1_HISTORIES) >= 2


@pytest.mark.parametrize("path", V1_HISTORIES, ids=lambda p: p.name)
async def test_patched_change_replays_histories_of_the_previous_version(path: Path) -> None:
    replayer = Replayer(workflows=[PatchedWorkItemWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history(path))


@pytest.mark.parametrize("path", V1_HISTORIES, ids=lambda p: p.name)
async def test_the_same_change_without_the_patch_breaks_in_flight_executions(path: Path) -> None:
    replayer = Replayer(workflows=[UnguardedWorkItemWorkflow], data_converter=pydantic_data_converter)
    with pytest.raises(NondeterminismError) as failure:
        await replayer.replay_workflow(history(path))
    # The new command meets the old history's first step: exactly what a worker of the new version would hit in
    # production. That step is admission (a local activity), or the agent for an item admitted before its workflow
    # started (crewwork/admission/starts.py).
    message = str(failure.value)
    assert "Nondeterminism" in message
    assert "LocalActivity" in message or "scheduled event 'run_agent'" in message, message
