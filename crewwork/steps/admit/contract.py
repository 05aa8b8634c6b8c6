"""Admission: the operator's policy, budget and the tenant's in-flight limit decide whether the item runs now, waits
in the tenant's queue, or does not run (the activity: crewwork/steps/admit/activity.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from crewwork.models import BudgetSpec, WorkItemSpec
from crewwork.steps.step import ItemRef, Step


class AdmitInput(ItemRef):
    spec: WorkItemSpec
    resumed: bool = False
    """The item has attempts already (a continued run, or reviewers sent it back): an admission out of `queued`
    reads their failure fingerprints too, for the breaker."""


class AdmitResult(BaseModel):
    admitted: bool
    reason: str = ""
    queued_position: int | None = None
    """Set when the tenant's in-flight limit is reached: the item's place in the tenant's queue (1 is next)."""
    budget: BudgetSpec | None = None
    """The budget the item runs under: its own, capped by the operator's ceilings (which also fill what it left
    unset). Decided once, at admission, so the workflow's limits are in its history."""
    review_timeout_s: float | None = None
    """The review deadline the item runs under (its own, capped by the operator's ceiling)."""
    # Persisted history, so that a restarted or continued-as-new workflow resumes counting from the store.
    past_fingerprints: list[str | None] = Field(default_factory=list)
    attempts_recorded: int = 0


ADMIT = Step("admit", AdmitInput, AdmitResult, local=True)
