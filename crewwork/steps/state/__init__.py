"""A state the workflow announces between steps (`queued` for a readmission, `awaiting_review`): one fenced write
that, when the item gives up its place, hands the place to the tenant's first queued items (the activity:
crewwork/steps/state/activity.py)."""

from __future__ import annotations

from crewwork.models import WorkItemState
from crewwork.steps.step import ItemRef, Step, WriteOutcome


class SetStateInput(ItemRef):
    state: WorkItemState
    reason: str = ""
    attempt: int | None = None


SET_STATE = Step("set_state", SetStateInput, WriteOutcome, local=True)
