"""An attempt's record (verdict, reason, failure fingerprint, the agent's and the validation's outcomes), written
fenced; the answer carries the item's fingerprints for the same-cause breaker (the activity:
crewwork/steps/record/activity.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from crewwork.models import AgentOutcome, ValidationOutcome
from crewwork.steps.step import ItemRef, Step


class RecordInput(ItemRef):
    attempt: int
    verdict: str
    reason: str
    cause: str | None = None
    fingerprint: str | None = None
    agent: AgentOutcome | None = None
    validation: ValidationOutcome | None = None


class RecordResult(BaseModel):
    ok: bool
    stale: bool = False
    fingerprints: list[str | None] = Field(default_factory=list)


RECORD_ATTEMPT = Step("record_attempt", RecordInput, RecordResult, local=True)
