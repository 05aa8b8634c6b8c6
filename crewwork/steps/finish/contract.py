"""The item's terminal decision, written fenced (with a `task` item's passing attempt, in one transaction); its place
goes to the tenant's first queued items (the activity: crewwork/steps/finish/activity.py)."""

from __future__ import annotations

from crewwork.models import WorkItemResult
from crewwork.steps.record import RecordInput
from crewwork.steps.step import ItemRef, Step, WriteOutcome


class FinishInput(ItemRef):
    result: WorkItemResult
    record: RecordInput | None = None
    """The last attempt's record, written in the same transaction as the result (a `task` item's passing attempt)."""


FINISH = Step("finish", FinishInput, WriteOutcome, local=True)
