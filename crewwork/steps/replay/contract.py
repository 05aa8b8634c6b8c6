"""Replay's contract: which attempt, and the report (ReplayWorkflow -> replay_attempt, on the agent pool)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.common import RetryPolicy

from crewwork.steps.step import Step


class ReplayInput(BaseModel):
    work_item_id: str
    tenant_id: str
    attempt: int


class ReplayOutcome(BaseModel):
    """The replay's report (crewwork.steps.replay.activity.ReplayReport as data), or why it could not run."""

    report: dict[str, Any] | None = None
    error: str | None = None


REPLAY_ATTEMPT = Step(
    "replay_attempt",
    ReplayInput,
    ReplayOutcome,
    pool="agent",
    start_to_close=timedelta(minutes=30),
    # A replay that fails is reported, not retried: running the agent again would be another replay.
    retry=RetryPolicy(maximum_attempts=1),
    dead="replay failed: {cause}",
)
