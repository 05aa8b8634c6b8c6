"""ReplayWorkflow: replay one recorded attempt on request, on the agent pool (which has the sandbox, the mirror and
the agent CLIs). One activity; started by the API (`POST /v1/work-items/{id}/replay?attempt=N`).

Deterministic code only."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from crewwork.steps.replay import REPLAY_ATTEMPT, ReplayInput, ReplayOutcome
    from crewwork.workflows.calls import execute


def replay_workflow_id(work_item_id: str, attempt: int, nonce: str) -> str:
    return f"replay-{work_item_id}-{attempt}-{nonce}"


@workflow.defn(name="ReplayWorkflow")
class ReplayWorkflow:
    @workflow.run
    async def run(self, inp: ReplayInput) -> ReplayOutcome:
        prefix = workflow.info().task_queue.rsplit("-", 1)[0]
        return await execute(REPLAY_ATTEMPT, inp, task_queue=f"{prefix}-agent")
