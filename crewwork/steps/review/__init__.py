"""A reviewer's decision recorded as a fact of the work item: the `review_decided` event and its webhook, written
fenced in one transaction (the activity: crewwork/steps/review/activity.py).

    contract.py  what the workflow sees: the step's input model and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.review.contract import (
    RECORD_REVIEW,
    RecordReviewInput,
)

__all__ = [
    "RECORD_REVIEW",
    "RecordReviewInput",
]
