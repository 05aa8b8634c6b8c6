"""The review step's activity: the decision as the item's `review_decided` event (and `work_item.reviewed` webhook),
once, at the rank Temporal scheduled it."""

from __future__ import annotations

from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.ports import Ports
from crewwork.steps.review import RecordReviewInput
from crewwork.steps.step import WriteOutcome
from crewwork.store.fencing import REVIEW_EVENT


async def record_review(ports: Ports, inp: RecordReviewInput) -> WriteOutcome:
    w = AttemptWriter.of(ports.store, inp)
    review = inp.review.model_dump(mode="json")
    # A retried attempt whose first write committed (its reply was lost) finds its decision there: recorded once.
    if await ports.store.has_event(
        inp.work_item_id, REVIEW_EVENT, attempt=review["attempt"], decided_at=review["decided_at"]
    ):
        return WriteOutcome(ok=True)
    res = await ports.store.record_review(w.write, review)
    return WriteOutcome(ok=res.ok, stale=not res.ok)
