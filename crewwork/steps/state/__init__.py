"""A state the workflow announces between steps (`queued` for a readmission, `awaiting_review`): one fenced write
that, when the item gives up its place, hands the place to the tenant's first queued items (the activity:
crewwork/steps/state/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.state.contract import (
    SET_STATE,
    SetStateInput,
)

__all__ = [
    "SET_STATE",
    "SetStateInput",
]
