"""An attempt's record (verdict, reason, failure fingerprint, the agent's and the validation's outcomes), written
fenced; the answer carries the item's fingerprints for the same-cause breaker (the activity:
crewwork/steps/record/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.record.contract import (
    RECORD_ATTEMPT,
    RecordInput,
    RecordResult,
)

__all__ = [
    "RECORD_ATTEMPT",
    "RecordInput",
    "RecordResult",
]
