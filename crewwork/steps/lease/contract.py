"""The workspace lease (one writer per repository branch: taken, renewed while a review waits, released) and the
cleanup of the item's worktrees at its end (the activities: crewwork/steps/lease/activity.py)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from crewwork.steps.step import ItemRef, Step

WORKSPACE_POLL = timedelta(seconds=2)
WORKSPACE_POLL_MAX = timedelta(seconds=30)
WORKSPACE_LEASE_TTL_S = 600.0


class WorkspaceLeaseInput(ItemRef):
    key: str
    ttl_s: float


class WorkspaceLeaseResult(BaseModel):
    grant: int | None = None
    holder: str | None = None


class ReleaseInput(ItemRef):
    key: str
    grant: int | None = None
    ttl_s: float | None = None
    """For a renewal: the new lifetime (the operator's default when None)."""


class CleanupInput(ItemRef):
    repo_path: str | None = None
    workspace_key: str | None = None
    """The workspace lease to give up first, with `workspace_grant` (the item's end as one local activity: `END`)."""
    workspace_grant: int | None = None


ACQUIRE_WORKSPACE = Step("acquire_workspace", WorkspaceLeaseInput, WorkspaceLeaseResult, local=True)
RENEW_WORKSPACE = Step("renew_workspace", ReleaseInput, bool, local=True)
RELEASE_WORKSPACE = Step("release_workspace", ReleaseInput, bool, local=True)
CLEANUP: Step[CleanupInput, None] = Step("cleanup", CleanupInput, None)
"""On the control task queue: how items that started before the patch `lean-end` end (their histories replay so)."""
END: Step[CleanupInput, None] = Step("cleanup", CleanupInput, None, local=True)
"""A code change's end: its workspace lease released and its worktrees removed, in one local activity of the control
worker that runs the workflow (one history marker, where the release's marker and `CLEANUP` on the control task queue
took a marker, three activity events and a workflow task of three). It writes nothing fenced: the release is by grant,
a retry of either part finds it done. Same activity as `CLEANUP`, so the pools register it once."""
