"""A state the workflow announces between steps (`queued` for a readmission, `awaiting_review`): one fenced write
that, when the item gives up its place, hands the place to the tenant's first queued items, and may carry the attempt
record that led to it (the activity: crewwork/steps/state/activity.py)."""

from __future__ import annotations

from crewwork.models import WorkItemState
from crewwork.steps.record import RecordInput
from crewwork.steps.step import ItemRef, Step, WriteOutcome


class SetStateInput(ItemRef):
    state: WorkItemState
    reason: str = ""
    attempt: int | None = None
    record: RecordInput | None = None
    """An attempt's record, written in the same transaction before the state change (the passing attempt with
    `awaiting_review`); a refused write records neither."""


SET_STATE = Step("set_state", SetStateInput, WriteOutcome, local=True)
