"""The bare-Temporal baseline: a workflow that runs the same number of no-op activities as a crewwork work item,
on the same task queues (control / agent / validate), with the same timeouts, and nothing else.

It lives in its own importable module because Temporal's workflow sandbox refuses workflows defined in `__main__`.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

# The activities a crewwork work item runs, in order, by pool (see crewwork/workflows/work_item.py).
TASK_SEQUENCE = ["control", "agent", "control", "control"]  # admit, run_agent, record_attempt, finish
CODE_CHANGE_SEQUENCE = [
    "control",  # admit
    "control",  # acquire_workspace
    "agent",  # run_agent
    "validate",  # validate_change
    "control",  # record_attempt
    "control",  # land_change
    "control",  # finish
    "control",  # release_workspace
    "control",  # cleanup
]


@activity.defn(name="bare_noop")
async def bare_noop(step: int) -> int:
    return step


@workflow.defn(name="BareWorkflow")
class BareWorkflow:
    @workflow.run
    async def run(self, queues: list[str]) -> int:
        for i, queue in enumerate(queues):
            await workflow.execute_activity(
                "bare_noop",
                i,
                task_queue=queue,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=8),
                result_type=int,
            )
        return len(queues)
