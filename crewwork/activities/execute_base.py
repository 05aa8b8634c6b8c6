"""What the execution activities share: the mirror and workspace of an attempt, artifacts, the sandbox choice and
its limits, the bounded report read (crewwork/activities/execute.py holds the activities themselves)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from temporalio.exceptions import ApplicationError

from crewwork import gitops, safefs
from crewwork.activities.common import AttemptWriter
from crewwork.agents.isolation import AgentProcesses
from crewwork.config import Settings
from crewwork.models import (
    ArtifactRef,
    SandboxSpec,
    WorkItemState,
)
from crewwork.repos.mirror import MirrorHold
from crewwork.repos.service import REPO_ERRORS, Repositories, repo_failure
from crewwork.sandbox.base import Sandbox, SandboxLimits
from crewwork.sandbox.config import SandboxSettings
from crewwork.sandbox.disk import DiskError
from crewwork.steps.agent import AgentStepInput
from crewwork.steps.errors import bad_input
from crewwork.store.artifacts import artifact_row
from crewwork.store.store import Store
from crewwork.store.tables import Artifact
from crewwork.workspace import Workspace, WorkspaceError

log = logging.getLogger("crewwork.activities.execute")

REPORT_DIR = gitops.PLATFORM_DIR
# The largest test report the host reads back (never more than the artifact limit either).
MAX_REPORT_BYTES = 16 * 1024 * 1024


def read_report(workspace: Path, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
    """The report a test run left at `rel`, read the only way the host reads a workspace file: beneath the
    workspace, no link followed, a single-link regular file, at most `max_bytes`. (content, None), (None, None)
    when there is none, or (None, why it was refused)."""
    try:
        return safefs.read_bytes(workspace, rel, max_bytes=max_bytes), None
    except FileNotFoundError:
        return None, None
    except safefs.Refused as exc:
        return None, f"{rel}: {exc.reason}"


def _ref(a: Artifact) -> ArtifactRef:
    return ArtifactRef(id=a.id, name=a.name, size=a.size, sha256=a.sha256, content_type=a.content_type)


def pick_sandbox(spec: SandboxSpec | None, settings: Settings, image: str | None = None) -> Sandbox:
    from crewwork.sandbox.registry import best_available, get_sandbox

    name = (spec.backend if spec and spec.backend else None) or settings.sandbox.backend
    if name is None:
        name, _why = best_available(settings.sandbox)
    if name == "local" and not settings.allow_unsafe_sandbox:
        raise bad_input(
            "sandbox backend `local` has no isolation and is refused unless the operator sets "
            "CREWWORK_ALLOW_UNSAFE_SANDBOX=true"
        )
    if image is not None and name not in ("docker", "gvisor"):
        raise bad_input(f"environment.image {image!r} needs the docker or gvisor sandbox backend, not {name!r}")
    try:
        if image is not None:
            return get_sandbox(
                name,
                allow_unsafe=settings.allow_unsafe_sandbox,
                settings=settings.sandbox.model_copy(update={"docker_image": image}),
            )
        return get_sandbox(name, allow_unsafe=settings.allow_unsafe_sandbox, settings=settings.sandbox)
    except ValueError as exc:
        raise bad_input(str(exc)) from exc


def sandbox_limits(spec: SandboxSpec | None, timeout_s: float | None, settings: SandboxSettings) -> SandboxLimits:
    from crewwork.sandbox.config import resolve_limits

    try:
        return resolve_limits(spec, settings, timeout_s=timeout_s)
    except ValueError as exc:
        raise bad_input(str(exc)) from exc


class StepBase:
    """State and helpers of the agent and validate pools' activities."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.repos = Repositories(settings)
        self.agent_processes = AgentProcesses(settings.agent_concurrency)
        """The agent slots' child processes (crewwork.agents.isolation)."""

    async def _mirror(self, w: AttemptWriter, locator: str, commit: str, attempt: int) -> MirrorHold:
        """This host's mirror of the repository, holding `commit` (fetched when it lacks it), kept from eviction
        until the hold is released: the git directory workspaces are made from (docs/repositories.md)."""
        try:
            # The registered repository's credential (crewwork.repos.tenancy), never one the tenant names.
            credential = await self.store.repository_credential(w.tenant_id, locator)
            hold = await self.repos.hold(locator, commit, await self.store.tenant_ref(w.tenant_id), credential)
        except REPO_ERRORS as exc:
            raise repo_failure(exc) from None
        if hold.stats.fetched:
            fetched = await w.event(
                "repository_fetched",
                {"attempt": attempt, "cloned": hold.stats.cloned, "seconds": round(hold.stats.seconds, 3)},
            )
            if fetched.stale:
                # The item ended (or a later attempt wrote) while this one fetched: it must not make a workspace the
                # item's cleanup has already been through.
                hold.release()
                raise w.stale(fetched, "fetching the repository")
        return hold

    async def _forget_item_dir(self, w: AttemptWriter) -> None:
        """Remove the item's (now empty) worktree directory if the item has ended: an attempt that outlived the
        item's cleanup (it was cancelled while it made its workspace) must not leave it behind. Only once the item
        has ended, so no other attempt can be creating a workspace in it."""
        found = await self.store.current_rank(w.work_item_id)
        if found is not None and WorkItemState(found[1]).terminal:
            with contextlib.suppress(OSError):
                (self.settings.resolved_worktree_dir() / w.work_item_id).rmdir()

    async def _save(self, work_item_id: str, tenant_id: str, name: str, data: bytes, ctype: str) -> ArtifactRef:
        if len(data) > self.settings.max_artifact_bytes:
            keep = self.settings.max_artifact_bytes - 200
            data = data[:keep] + f"\n[truncated: {len(data)} bytes in all]\n".encode()
        art = await self.store.put_artifact(
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            name=name,
            data=data,
            content_type=ctype,
            max_bytes=self.settings.max_artifact_bytes,
        )
        return _ref(art)

    def _pending(self, inp: AgentStepInput, name: str, data: bytes, ctype: str) -> tuple[ArtifactRef, dict[str, Any]]:
        """An artifact the attempt's last write inserts (`_agent_finished`), and its ref: it exists only if that
        write is accepted, in the same transaction."""
        if len(data) > self.settings.max_artifact_bytes:
            keep = self.settings.max_artifact_bytes - 200
            data = data[:keep] + f"\n[truncated: {len(data)} bytes in all]\n".encode()
        row = artifact_row(
            work_item_id=inp.work_item_id,
            tenant_id=inp.tenant_id,
            name=name,
            data=data,
            content_type=ctype,
            max_bytes=self.settings.max_artifact_bytes,
        )
        ref = ArtifactRef(id=row["id"], name=name, size=row["size"], sha256=row["sha256"], content_type=ctype)
        return ref, row

    async def _workspace(
        self,
        git_dir: Path,
        work_item_id: str,
        name: str,
        commit: str,
        limits: SandboxLimits,
        *,
        materialise: bool = True,
    ) -> Workspace:
        """A fresh workspace for one agent run or validation, with the operator's disk cap and sandbox owner."""
        sandbox_settings = self.settings.sandbox
        try:
            return await Workspace.create(
                git_dir=git_dir,
                home=self.settings.resolved_worktree_dir() / work_item_id / name,
                commit=commit,
                disk_mb=sandbox_settings.workspace_disk_mb(limits),
                owner=sandbox_settings.owner(),
                materialise=materialise,
            )
        except WorkspaceError as exc:
            raise bad_input(str(exc)) from exc
        except DiskError as exc:
            raise ApplicationError(f"workspace disk: {exc}", type="SandboxError") from exc
