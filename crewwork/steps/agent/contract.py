"""One attempt's agent run: in a fresh workspace of its own, in a sandbox, the change captured by the platform (the
activity: crewwork/steps/agent/activity.py)."""

from __future__ import annotations

from datetime import timedelta

from crewwork.models import AgentOutcome, WorkItemSpec
from crewwork.steps.step import EXECUTION_HEARTBEAT, EXECUTION_RETRY, ItemRef, Step

AGENT_START_TO_CLOSE = timedelta(minutes=30)


class AgentStepInput(ItemRef):
    attempt: int
    spec: WorkItemSpec
    repo_path: str | None = None
    base_commit: str | None = None
    diagnostics: str | None = None
    review_comment: str | None = None


RUN_AGENT = Step(
    "run_agent",
    AgentStepInput,
    AgentOutcome,
    pool="agent",
    start_to_close=AGENT_START_TO_CLOSE,
    heartbeat=EXECUTION_HEARTBEAT,
    retry=EXECUTION_RETRY,
    dead="agent step failed{tries}: {cause}",
    bad_input="bad input: {cause}",
)
