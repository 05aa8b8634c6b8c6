"""The workspace lease (one writer per repository branch: taken, renewed while a review waits, released) and the
cleanup of the item's worktrees at its end (the activities: crewwork/steps/lease/activity.py).

    contract.py  what the workflow sees: the step's input and result models and its `Step` policy
    activity.py  the activity, a plain function of explicit ports (loaded by the pools only)
"""

from __future__ import annotations

from crewwork.steps.lease.contract import (
    ACQUIRE_WORKSPACE,
    CLEANUP,
    END,
    RELEASE_WORKSPACE,
    RENEW_WORKSPACE,
    WORKSPACE_LEASE_TTL_S,
    WORKSPACE_POLL,
    WORKSPACE_POLL_MAX,
    CleanupInput,
    ReleaseInput,
    WorkspaceLeaseInput,
    WorkspaceLeaseResult,
)

__all__ = [
    "ACQUIRE_WORKSPACE",
    "CLEANUP",
    "END",
    "RELEASE_WORKSPACE",
    "RENEW_WORKSPACE",
    "WORKSPACE_LEASE_TTL_S",
    "WORKSPACE_POLL",
    "WORKSPACE_POLL_MAX",
    "CleanupInput",
    "ReleaseInput",
    "WorkspaceLeaseInput",
    "WorkspaceLeaseResult",
]
