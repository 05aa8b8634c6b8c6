"""Control-pool activities: admission, fenced state and attempt records, workspace leases, landing, cleanup.

These are short store/git operations. Each write takes a fresh fencing token first, so a retried or late copy of
an activity can never overwrite what a newer one wrote.
"""

from __future__ import annotations

import logging
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crewwork import gitops
from crewwork.activities.common import LANDING_CONFLICT, bad_input
from crewwork.config import Settings
from crewwork.contracts import (
    AdmitInput,
    AdmitResult,
    CleanupInput,
    FinishInput,
    LandInput,
    LandResult,
    RecordInput,
    RecordResult,
    ReleaseInput,
    SetStateInput,
    WorkspaceLeaseInput,
    WorkspaceLeaseResult,
    WriteOutcome,
)
from crewwork.models import ArtifactRef, WorkItemState
from crewwork.store.store import AttemptRecord, Store
from crewwork.workspace import remove_tree

log = logging.getLogger("crewwork.activities.control")


def _writer() -> str:
    try:
        info = activity.info()
        return f"{info.activity_type}#{info.attempt}"
    except RuntimeError:
        return "direct"


def _attempt_record(inp: RecordInput) -> AttemptRecord:
    return AttemptRecord(
        number=inp.attempt,
        verdict=inp.verdict,
        reason=inp.reason,
        cause=inp.cause,
        fingerprint=inp.fingerprint,
        agent=inp.agent.model_dump(mode="json") if inp.agent else None,
        validation=inp.validation.model_dump(mode="json") if inp.validation else None,
    )


class ControlActivities:
    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    @activity.defn(name="admit")
    async def admit(self, inp: AdmitInput) -> AdmitResult:
        b = inp.spec.budget
        s = self.settings
        problems = []
        if b.max_attempts > s.max_attempts_ceiling:
            problems.append(f"budget.max_attempts {b.max_attempts} > ceiling {s.max_attempts_ceiling}")
        if b.max_wall_clock_s and b.max_wall_clock_s > s.max_wall_clock_s_ceiling:
            problems.append(f"budget.max_wall_clock_s {b.max_wall_clock_s} > ceiling {s.max_wall_clock_s_ceiling}")
        if b.max_tokens and b.max_tokens > s.max_tokens_ceiling:
            problems.append(f"budget.max_tokens {b.max_tokens} > ceiling {s.max_tokens_ceiling}")
        if b.max_cost_usd and b.max_cost_usd > s.max_cost_usd_ceiling:
            problems.append(f"budget.max_cost_usd {b.max_cost_usd} > ceiling {s.max_cost_usd_ceiling}")
        if problems:
            if await self.store.get_work_item(inp.work_item_id, inp.tenant_id) is None:
                raise bad_input(f"work item {inp.work_item_id} is not in the store")
            return AdmitResult(admitted=False, reason="; ".join(problems))
        # One transaction: a fresh token, submitted -> admitted, and the attempts so far (Store.admit).
        res = await self.store.admit(work_item_id=inp.work_item_id, tenant_id=inp.tenant_id, writer=_writer())
        if res.missing:
            raise bad_input(f"work item {inp.work_item_id} is not in the store")
        if res.closed:
            return AdmitResult(admitted=False, reason=f"already {res.state}")
        fps = res.value or []
        return AdmitResult(admitted=True, past_fingerprints=fps, attempts_recorded=len(fps))

    @activity.defn(name="set_state")
    async def set_state(self, inp: SetStateInput) -> WriteOutcome:
        res = await self.store.set_state(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            token=None,
            state=inp.state,
            reason=inp.reason,
            writer=_writer(),
            event_data={"attempt": inp.attempt} if inp.attempt is not None else None,
        )
        return WriteOutcome(ok=res.ok, stale=res.stale, token=res.token or 0)

    @activity.defn(name="acquire_workspace")
    async def acquire_workspace(self, inp: WorkspaceLeaseInput) -> WorkspaceLeaseResult:
        token, holder = await self.store.acquire_lease(inp.key, inp.work_item_id, inp.ttl_s)
        if token is not None:
            await self.store.append_event(
                inp.work_item_id, inp.tenant_id, "workspace_acquired", {"key": inp.key}, token=token
            )
        return WorkspaceLeaseResult(token=token, holder=holder)

    @activity.defn(name="renew_workspace")
    async def renew_workspace(self, inp: ReleaseInput) -> bool:
        if inp.token is None:
            return False
        return await self.store.renew_lease(inp.key, inp.token, self.settings.lease_ttl_s * 10)

    @activity.defn(name="release_workspace")
    async def release_workspace(self, inp: ReleaseInput) -> bool:
        released = await self.store.release_lease(inp.key, token=inp.token, holder=inp.work_item_id)
        if not released:
            # Landing may have taken the lease back under a new token after it expired: free whatever this item holds.
            released = await self.store.release_lease(inp.key, holder=inp.work_item_id)
        if released:
            await self.store.append_event(
                inp.work_item_id, inp.tenant_id, "workspace_released", {"key": inp.key}, token=inp.token
            )
        return released

    @activity.defn(name="record_attempt")
    async def record_attempt(self, inp: RecordInput) -> RecordResult:
        res = await self.store.record_attempt(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            token=None,
            record=_attempt_record(inp),
            writer=_writer(),
        )
        # Rejected (the item is closed): report the recorded history as it stands.
        fingerprints = res.value if res.value is not None else await self.store.fingerprints(inp.work_item_id)
        return RecordResult(ok=res.ok, stale=res.stale, fingerprints=fingerprints)

    @activity.defn(name="land_change")
    async def land_change(self, inp: LandInput) -> LandResult:
        res = await self.store.set_state(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            token=None,
            state=WorkItemState.landing,
            reason="landing",
            writer=_writer(),
        )
        if res.stale:
            raise ApplicationError("a newer writer superseded this landing", type="StaleWrite")
        assert res.token is not None
        token = res.token
        diff = (await self._artifact_bytes(inp.diff_ref.id)).decode()
        repo = Path(inp.repo_path)
        if inp.workspace_token is not None and inp.workspace_key:
            key = inp.workspace_key
            if not await self.store.renew_lease(key, inp.workspace_token, self.settings.lease_ttl_s * 10):
                # The lease expired while the item waited (typically for a slow review). Landing stays safe without
                # it: it writes only this item's own delivery branch, by compare-and-swap, and this activity is the
                # item's newest fenced writer (checked above). Take the lease back if it is free, and say so.
                again, holder = await self.store.acquire_lease(key, inp.work_item_id, self.settings.lease_ttl_s * 10)
                await self.store.append_event(
                    inp.work_item_id,
                    inp.tenant_id,
                    "workspace_lease_expired",
                    {"key": key, "expired_token": inp.workspace_token, "reacquired_token": again, "holder": holder},
                    token=again,
                )
        scratch = self.settings.resolved_worktree_dir() / inp.work_item_id / f"land-t{token}"
        try:
            branch, commit, created = await gitops.land(
                gitops.git_dir_of(repo),
                work_item_id=inp.work_item_id,
                base_commit=inp.base_commit,
                diff=diff,
                message=inp.message,
                scratch=scratch,
            )
        except gitops.GitError as exc:
            raise ApplicationError(str(exc), type=LANDING_CONFLICT, non_retryable=True) from exc
        patch = await self.store.put_artifact(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            name="landed.patch",
            data=diff.encode(),
            content_type="text/x-diff",
        )
        # A retried landing (the ref moved but the activity did not complete) finds the same commit: record the
        # landing once, so the event log holds exactly one `landed` per delivered change.
        already = any(
            e.type == "landed" and e.data.get("commit") == commit
            for e in await self.store.list_events(inp.work_item_id)
        )
        if not already:
            await self.store.append_event(
                inp.work_item_id,
                inp.tenant_id,
                "landed",
                {"branch": branch, "commit": commit, "created": created},
                token=token,
            )
        return LandResult(
            branch=branch,
            commit=commit,
            created=created,
            patch_ref=ArtifactRef(
                id=patch.id,
                name=patch.name,
                size=patch.size,
                sha256=patch.sha256,
                content_type=patch.content_type,
            ),
        )

    async def _artifact_bytes(self, artifact_id: str) -> bytes:
        data = await self.store.artifact_content(artifact_id)
        if data is None:
            raise bad_input(f"artifact {artifact_id} is missing")
        return data

    @activity.defn(name="finish")
    async def finish(self, inp: FinishInput) -> WriteOutcome:
        """Write the workflow's terminal decision. The workflow is the authority on the outcome, so the write takes
        its token inside its own transaction: no zombie attempt can slip a newer token in between, and once the item
        is terminal every later fenced write is rejected, zombies included."""
        r = inp.result
        res = await self.store.set_state(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            token=None,
            state=r.state,
            reason=r.reason,
            writer=_writer(),
            fields={
                "result": r.model_dump(mode="json"),
                "delivery_branch": r.delivery_branch,
                "landed_commit": r.landed_commit,
                "mock": r.mock,
            },
            record=_attempt_record(inp.record) if inp.record is not None else None,
        )
        # Already terminal (a retried finish whose first write landed): nothing left to do.
        return WriteOutcome(ok=res.ok or res.closed, stale=not (res.ok or res.closed), token=res.token or 0)

    @activity.defn(name="cleanup")
    async def cleanup(self, inp: CleanupInput) -> None:
        # Unmounts the item's workspace disks first; deletion never follows a link a sandbox left behind.
        await remove_tree(self.settings.resolved_worktree_dir() / inp.work_item_id)
        if inp.repo_path and Path(inp.repo_path).exists():
            await gitops.git("worktree", "prune", cwd=inp.repo_path, check=False)
