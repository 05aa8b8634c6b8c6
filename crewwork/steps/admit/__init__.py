"""Admission: the operator's policy, budget and the tenant's in-flight limit decide whether the item runs now, waits
in the tenant's queue, or does not run (the activity: crewwork/steps/admit/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.admit.contract import (
    ADMIT,
    AdmitInput,
    AdmitResult,
)

__all__ = [
    "ADMIT",
    "AdmitInput",
    "AdmitResult",
]
