"""A reviewer's decision recorded as a fact of the work item: the `review_decided` event and its webhook, written
fenced in one transaction (the activity: crewwork/steps/review/activity.py)."""

from __future__ import annotations

from crewwork.models import ReviewRecord
from crewwork.steps.step import ItemRef, Step, WriteOutcome


class RecordReviewInput(ItemRef):
    review: ReviewRecord


RECORD_REVIEW = Step("record_review", RecordReviewInput, WriteOutcome, local=True)
"""A short store write: a local activity of the workflow."""
