"""Two versions of one workflow change, for the versioning test and docs/operations.md: a new step ("tell the
tenant the item started") added at the start of WorkItemWorkflow, once guarded by `workflow.patched` and once not.

Both keep the registered name `WorkItemWorkflow`, as a deployed change would. The new step is an activity referred to
by name only: replay never runs activities, it only compares the commands the code issues with the history."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from crewwork.models import WorkItemInput, WorkItemResult
    from crewwork.workflows.work_item import WorkItemWorkflow

PATCH_ID = "notify-tenant-on-start"
NOTIFY_TIMEOUT = timedelta(seconds=30)


async def _notify_started(inp: WorkItemInput) -> None:
    await workflow.execute_activity(
        "notify_started",
        inp.work_item_id,
        task_queue=workflow.info().task_queue,
        start_to_close_timeout=NOTIFY_TIMEOUT,
    )


@workflow.defn(name="WorkItemWorkflow")
class PatchedWorkItemWorkflow(WorkItemWorkflow):
    """The right way: executions that started before the change take the old path when they replay."""

    @workflow.run
    async def run(self, inp: WorkItemInput) -> WorkItemResult:
        if workflow.patched(PATCH_ID):
            await _notify_started(inp)
        return await super().run(inp)


@workflow.defn(name="WorkItemWorkflow")
class UnguardedWorkItemWorkflow(WorkItemWorkflow):
    """The wrong way: the same change in place. Every in-flight execution fails its next workflow task."""

    @workflow.run
    async def run(self, inp: WorkItemInput) -> WorkItemResult:
        await _notify_started(inp)
        return await super().run(inp)
