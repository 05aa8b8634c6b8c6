"""The item's terminal decision, written fenced (with a `task` item's passing attempt, in one transaction); its place
goes to the tenant's first queued items (the activity: crewwork/steps/finish/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.finish.contract import (
    FINISH,
    FinishInput,
)

__all__ = [
    "FINISH",
    "FinishInput",
]
