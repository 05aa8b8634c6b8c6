"""Landing: the passing attempt's change committed on the item's delivery branch (compare-and-swap), its evidence
signed, a pull request opened where asked (the activity: crewwork/steps/land/activity.py)."""

from __future__ import annotations

from pydantic import BaseModel

from crewwork.models import ArtifactRef, PullRequestSpec, ReviewDecision
from crewwork.steps.step import ItemRef, Step


class LandInput(ItemRef):
    repo_path: str
    base_commit: str
    diff_ref: ArtifactRef
    message: str
    workspace_key: str | None = None
    workspace_grant: int | None = None
    pull_request: PullRequestSpec | None = None
    """Open a pull request for the landed branch (also when the repository's forge says `always`)."""
    ref: str | None = None
    """The work item's `repo.ref`: the pull request's base when it names a branch."""
    attempt: int | None = None
    """The attempt whose change lands (its evidence is signed); None in histories from before evidence bundles."""
    review: ReviewDecision | None = None
    """The reviewer's decision that let it land (None: no review was required), for the signed review statement."""
    review_decided_at: float | None = None
    """When the decision reached the workflow (workflow time, epoch seconds)."""


class LandResult(BaseModel):
    branch: str
    commit: str
    created: bool
    patch_ref: ArtifactRef | None = None
    pull_request_url: str | None = None


LAND = Step("land_change", LandInput, LandResult)
"""On the control task queue, not local: git work (fetch, commit, push) may take longer than a local activity."""
