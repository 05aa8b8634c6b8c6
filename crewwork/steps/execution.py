"""What the agent and validate steps share: an attempt's mirror and workspace, its artifacts, the sandbox choice and
its limits, the bounded report read (the activities: crewwork/steps/agent/activity.py, .../validate/activity.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from temporalio.exceptions import ApplicationError

from crewwork.boundary import safefs
from crewwork.config import Settings
from crewwork.config.sandbox import SandboxSettings, resolve_limits
from crewwork.models import ArtifactRef, EvidenceCut, SandboxSpec, WorkItemState
from crewwork.repos.git import RemoteError
from crewwork.repos.mirror import MirrorHold
from crewwork.repos.worker import REPO_ERRORS
from crewwork.sandbox.base import Sandbox, SandboxLimits
from crewwork.sandbox.disk import DiskError, workspace_disk_mb
from crewwork.steps.attempt import AttemptWriter
from crewwork.steps.errors import REPOSITORY_ERROR, REPOSITORY_UNAVAILABLE, bad_input
from crewwork.steps.ports import Ports
from crewwork.workspace.tree import Workspace, WorkspaceError, gitops

REPORT_DIR = gitops.PLATFORM_DIR
# The largest test report the host reads back (never more than the artifact limit either).
MAX_REPORT_BYTES = 16 * 1024 * 1024


def read_report(workspace: Path, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
    """The report a test run left at `rel`, read the only way the host reads a workspace file: beneath the
    workspace, no link followed, a single-link regular file, at most `max_bytes`. (content, None), (None, None)
    when there is none, or (None, why it was refused)."""
    data, refused, _cut = read_report_bounded(workspace, rel, max_bytes)
    return data, refused


def read_report_bounded(
    workspace: Path, rel: str, max_bytes: int, *, bound: str = "MAX_REPORT_BYTES"
) -> tuple[bytes | None, str | None, EvidenceCut | None]:
    """`read_report`, and the decisive cut when the report is over `max_bytes` (`bound` names the bound): a report
    the host did not read is evidence cut by a bound, never a pass (crewwork.validation.bounded)."""
    try:
        return safefs.read_bytes(workspace, rel, max_bytes=max_bytes), None, None
    except FileNotFoundError:
        return None, None, None
    except safefs.TooLarge as exc:
        cut = EvidenceCut(
            what=f"test report {rel}",
            bound=bound,
            limit=max_bytes,
            unit="bytes",
            seen=exc.size,
            kept=0,
            decisive=True,
            why="the host reads no report over its size bound, so nothing in it was judged",
        )
        return None, f"{rel}: {exc.reason}", cut
    except safefs.Refused as exc:
        return None, f"{rel}: {exc.reason}", None


def bounded(data: bytes, max_bytes: int) -> bytes:
    """`data`, cut to fit the operator's artifact limit: its start and its end (where a log's summary is), with a
    line between them saying how much was left out."""
    if len(data) <= max_bytes:
        return data
    room = max(0, max_bytes - 200)
    head, tail = data[: room // 2], data[len(data) - (room - room // 2) :] if room else b""
    note = f"\n[truncated: {len(data)} bytes in all, {len(data) - len(head) - len(tail)} left out here]\n"
    return head + note.encode() + tail


def pick_sandbox(spec: SandboxSpec | None, settings: Settings, image: str | None = None) -> Sandbox:
    from crewwork.sandbox.backends import best_available, get_sandbox

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
    try:
        return resolve_limits(spec, settings, timeout_s=timeout_s)
    except ValueError as exc:
        raise bad_input(str(exc)) from exc


async def hold_mirror(ports: Ports, w: AttemptWriter, locator: str, commit: str, attempt: int) -> MirrorHold:
    """This host's mirror of the repository, holding `commit` (fetched when it lacks it), kept from eviction
    until the hold is released: the git directory workspaces are made from (docs/repositories.md)."""
    try:
        # The registered repository's credential (crewwork.repos.tenancy), never one the tenant names.
        credential = await ports.store.repository_credential(w.tenant_id, locator)
        hold = await ports.repos.hold(locator, commit, await ports.store.tenant_ref(w.tenant_id), credential)
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


async def forget_item_dir(ports: Ports, w: AttemptWriter) -> None:
    """Remove the item's (now empty) worktree directory if the item has ended: an attempt that outlived the
    item's cleanup (it was cancelled while it made its workspace) must not leave it behind. Only once the item
    has ended, so no other attempt can be creating a workspace in it."""
    found = await ports.store.current_rank(w.work_item_id)
    if found is not None and WorkItemState(found[1]).terminal:
        with contextlib.suppress(OSError):
            (ports.settings.resolved_worktree_dir() / w.work_item_id).rmdir()


async def save(ports: Ports, w: AttemptWriter, name: str, data: bytes, ctype: str = "text/plain") -> ArtifactRef:
    """Store an artifact of the attempt's item (cut to the operator's limit)."""
    limit = ports.settings.max_artifact_bytes
    art = await ports.store.put_artifact(
        work_item_id=w.work_item_id,
        tenant_id=w.tenant_id,
        name=name,
        data=bounded(data, limit),
        content_type=ctype,
        max_bytes=limit,
    )
    return art.ref()


async def make_workspace(
    ports: Ports,
    git_dir: Path,
    work_item_id: str,
    name: str,
    commit: str,
    limits: SandboxLimits,
    *,
    materialise: bool = True,
) -> Workspace:
    """A fresh workspace for one agent run or validation, with the operator's disk cap and sandbox owner."""
    sandbox_settings = ports.settings.sandbox
    try:
        return await Workspace.create(
            git_dir=git_dir,
            home=ports.settings.resolved_worktree_dir() / work_item_id / name,
            commit=commit,
            disk_mb=workspace_disk_mb(sandbox_settings, limits),
            owner=sandbox_settings.owner(),
            materialise=materialise,
        )
    except WorkspaceError as exc:
        raise bad_input(str(exc)) from exc
    except DiskError as exc:
        raise ApplicationError(f"workspace disk: {exc}", type="SandboxError") from exc


def repo_failure(exc: BaseException) -> Exception:
    """The Temporal error for a repository failure (types in crewwork/steps/errors.py): retryable while the
    remote is unreachable, not otherwise. The workflow ends the item `failed` naming the remote, never `dead`."""
    if isinstance(exc, RemoteError) and exc.retryable:
        return ApplicationError(str(exc), type=REPOSITORY_UNAVAILABLE)
    return ApplicationError(str(exc), type=REPOSITORY_ERROR, non_retryable=True)
