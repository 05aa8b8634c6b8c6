"""The workspace step's activities: the lease (on the database clock) and the cleanup of the item's worktrees."""

from __future__ import annotations

from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.lease import CleanupInput, ReleaseInput, WorkspaceLeaseInput, WorkspaceLeaseResult
from crewwork.steps.ports import Ports
from crewwork.workspace.tree import remove_tree


async def acquire_workspace(ports: Ports, inp: WorkspaceLeaseInput) -> WorkspaceLeaseResult:
    grant, holder = await ports.store.acquire_lease(inp.key, inp.work_item_id, inp.ttl_s)
    if grant is not None:
        await AttemptWriter.of(ports.store, inp).event("workspace_acquired", {"key": inp.key, "grant": grant})
    return WorkspaceLeaseResult(grant=grant, holder=holder)


async def renew_workspace(ports: Ports, inp: ReleaseInput) -> bool:
    if inp.grant is None:
        return False
    return await ports.store.renew_lease(inp.key, inp.grant, inp.ttl_s or ports.settings.lease_ttl_s * 10)


async def release_workspace(ports: Ports, inp: ReleaseInput) -> bool:
    store = ports.store
    released = await store.release_lease(inp.key, grant=inp.grant, holder=inp.work_item_id)
    if not released:
        # Landing may have taken the lease again under a new grant after it expired: free what this item holds.
        released = await store.release_lease(inp.key, holder=inp.work_item_id)
    if released:
        await store.append_event(inp.work_item_id, inp.tenant_id, "workspace_released", {"key": inp.key})
    return released


async def cleanup(ports: Ports, inp: CleanupInput) -> None:
    """The item's end on this host: its workspace lease given up (when `inp` names it), then its worktrees removed."""
    if inp.workspace_key is not None:
        lease = ReleaseInput(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            step=inp.step,
            key=inp.workspace_key,
            grant=inp.workspace_grant,
        )
        await release_workspace(ports, lease)
    # Unmounts the item's workspace disks first; deletion never follows a link a sandbox left behind.
    await remove_tree(ports.settings.resolved_worktree_dir() / inp.work_item_id)
    if inp.repo_path:
        # Forget worktrees of this host's mirror whose directories are gone (none are made any more; older
        # releases made them).
        await ports.repos.prune(inp.repo_path)
