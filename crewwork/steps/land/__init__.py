"""Landing: the passing attempt's change committed on the item's delivery branch (compare-and-swap), its evidence
signed, a pull request opened where asked (the activity: crewwork/steps/land/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.land.contract import (
    LAND,
    LandInput,
    LandResult,
)

__all__ = [
    "LAND",
    "LandInput",
    "LandResult",
]
