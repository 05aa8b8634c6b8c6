"""Error intake's persistence (docs/errors-intake.md): the projects (a registered repository's error intake, the
DSN's project id and key) and the groups their reports are counted in.

ONE work item per group at a time is one row per (project, fingerprint) (`uq_error_groups_fingerprint`) whose
`status` is the intake's queue: `record` counts a report into its group in one transaction (the row locked on
PostgreSQL; a race to insert the same new group ends as a count of the winner's row), and only a new group, or a
group whose item has ended, is (re)queued. The intake (crewwork/api/errors_intake.py) claims due groups with a lease
on `next_attempt_at` (`FOR UPDATE SKIP LOCKED` on PostgreSQL), like the forge intake claims triggers.

Reads return frozen values, never ORM rows.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError

from crewwork.models import TERMINAL_STATES
from crewwork.store.engine import Database
from crewwork.store.tables import ErrorGroup, ErrorProject, Repository, WorkItem

_ENDED = [str(s) for s in TERMINAL_STATES]


def new_public_key() -> str:
    """A DSN public key: 32 hex digits (128 random bits), the shape Sentry's own keys have."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class Project:
    id: int
    tenant_id: str
    repository_id: str
    repository_url: str
    public_key: str
    fence_secret: str
    settings: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class Recorded:
    """What `record` did with a report: `new` (a new group, queued), `counted` (a repeat of a group whose item has
    not ended, or is still being made), `reopened` (a repeat of a group whose item ended: its next item is
    queued), `over_limit` (a new error while the project has `max_open_groups` open: not recorded)."""

    outcome: str
    group_id: int | None = None
    count: int = 0


@dataclass(frozen=True)
class ClaimedGroup:
    id: int
    project_id: int
    tenant_id: str
    fingerprint: str
    generation: int
    sample: dict[str, Any]
    previous_work_item_id: str | None
    attempts: int


@dataclass(frozen=True)
class GroupRecord:
    id: int
    fingerprint: str
    title: str
    generation: int
    count: int
    total: int
    first_seen: float
    last_seen: float
    status: str
    work_item_id: str | None
    previous_work_item_id: str | None
    last_error: str | None


class ErrorStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------------ projects

    async def register(self, *, tenant_id: str, repository_id: str, settings: dict[str, Any]) -> tuple[Project, bool]:
        """The repository's project, made now (True) or with its settings replaced (False; the key is kept, so
        re-registering never breaks the apps that report to it)."""
        async with self.db.session() as s:
            row = await s.scalar(
                select(ErrorProject)
                .where(ErrorProject.repository_id == repository_id, ErrorProject.tenant_id == tenant_id)
                .with_for_update()
            )
            made = row is None
            if row is None:
                row = ErrorProject(
                    tenant_id=tenant_id,
                    repository_id=repository_id,
                    public_key=new_public_key(),
                    fence_secret=secrets.token_hex(32),
                    settings=settings,
                    created_at=await self.db.now(s),
                )
                s.add(row)
                await s.flush()
            else:
                row.settings = settings
            url = await s.scalar(select(Repository.url).where(Repository.id == repository_id))
            return _project(row, str(url)), made

    async def rotate_key(self, tenant_id: str, repository_id: str) -> Project | None:
        async with self.db.session() as s:
            row = await s.scalar(
                select(ErrorProject)
                .where(ErrorProject.repository_id == repository_id, ErrorProject.tenant_id == tenant_id)
                .with_for_update()
            )
            if row is None:
                return None
            row.public_key = new_public_key()
            url = await s.scalar(select(Repository.url).where(Repository.id == repository_id))
            return _project(row, str(url))

    async def project(self, project_id: int) -> Project | None:
        async with self.db.session() as s:
            found = (
                await s.execute(
                    select(ErrorProject, Repository.url)
                    .join(Repository, Repository.id == ErrorProject.repository_id)
                    .where(ErrorProject.id == project_id)
                )
            ).first()
            return None if found is None else _project(found[0], found[1])

    async def project_of(self, tenant_id: str, repository_id: str) -> Project | None:
        async with self.db.session() as s:
            found = (
                await s.execute(
                    select(ErrorProject, Repository.url)
                    .join(Repository, Repository.id == ErrorProject.repository_id)
                    .where(ErrorProject.repository_id == repository_id, ErrorProject.tenant_id == tenant_id)
                )
            ).first()
            return None if found is None else _project(found[0], found[1])

    async def unregister(self, tenant_id: str, repository_id: str) -> bool:
        async with self.db.session() as s:
            res = await s.execute(
                delete(ErrorProject).where(
                    ErrorProject.repository_id == repository_id, ErrorProject.tenant_id == tenant_id
                )
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ reports

    async def record(
        self,
        project: Project,
        fingerprint: str,
        title: str,
        sample: dict[str, Any],
        *,
        max_open_groups: int,
        times: int = 1,
    ) -> Recorded:
        """Count `times` reports of `fingerprint` (one request's repeats of it) into its group (the class's
        docstring)."""
        for _ in range(3):
            try:
                return await self._record(project, fingerprint, title, sample, max_open_groups, times)
            except IntegrityError:
                continue  # another process inserted the same new group: count into it
        raise RuntimeError("error group kept changing under the report")  # pragma: no cover

    async def _record(
        self, project: Project, fingerprint: str, title: str, sample: dict[str, Any], max_open_groups: int, times: int
    ) -> Recorded:
        async with self.db.session() as s:
            now = await self.db.now(s)
            q = select(ErrorGroup).where(ErrorGroup.project_id == project.id, ErrorGroup.fingerprint == fingerprint)
            if not self.db.is_sqlite:
                q = q.with_for_update()
            row = await s.scalar(q)
            if row is not None:
                # A group whose submission failed (the policy refused it, or Temporal stayed down) is tried again
                # by its next report, like one whose item ended.
                ended = row.status == "failed"
                if row.status == "submitted" and row.work_item_id is not None:
                    state = await s.scalar(select(WorkItem.state).where(WorkItem.id == row.work_item_id))
                    ended = state is None or str(state) in _ENDED
                if not ended:
                    row.count += times
                    row.total += times
                    row.last_seen = now
                    return Recorded("counted", row.id, row.count)
                if await self._open_groups(s, project.id) >= max_open_groups:
                    return Recorded("over_limit")
                row.previous_work_item_id = row.work_item_id or row.previous_work_item_id
                row.work_item_id = None
                row.generation += 1
                row.count = times
                row.total += times
                row.title, row.sample = title, sample
                row.last_seen = row.next_attempt_at = now
                row.status, row.attempts, row.last_error = "pending", 0, None
                return Recorded("reopened", row.id, times)
            if await self._open_groups(s, project.id) >= max_open_groups:
                return Recorded("over_limit")
            row = ErrorGroup(
                project_id=project.id,
                tenant_id=project.tenant_id,
                fingerprint=fingerprint,
                generation=1,
                title=title,
                sample=sample,
                count=times,
                total=times,
                first_seen=now,
                last_seen=now,
                status="pending",
                attempts=0,
                next_attempt_at=now,
            )
            s.add(row)
            await s.flush()
            return Recorded("new", row.id, times)

    async def _open_groups(self, s: Any, project_id: int) -> int:
        """Groups of the project whose item is queued, being made, or not ended."""
        q = (
            select(func.count())
            .select_from(ErrorGroup)
            .outerjoin(WorkItem, WorkItem.id == ErrorGroup.work_item_id)
            .where(
                ErrorGroup.project_id == project_id,
                or_(
                    ErrorGroup.status == "pending",
                    and_(ErrorGroup.status == "submitted", WorkItem.state.not_in(_ENDED)),
                ),
            )
        )
        return int(await s.scalar(q) or 0)

    # ------------------------------------------------------------------ the intake's queue

    async def claim_groups(self, limit: int, claim_s: float) -> list[ClaimedGroup]:
        g = ErrorGroup
        due = lambda: select(g.id).where(g.status == "pending", g.next_attempt_at <= self.db.now_sql()).limit(1)  # noqa: E731
        if not await self.db.any_row("error_groups_due", due):
            return []
        async with self.db.session() as s:
            now = await self.db.now(s)
            q = (
                select(ErrorGroup)
                .where(ErrorGroup.status == "pending", ErrorGroup.next_attempt_at <= now)
                .order_by(ErrorGroup.next_attempt_at, ErrorGroup.id)
                .limit(limit)
            )
            if not self.db.is_sqlite:
                q = q.with_for_update(skip_locked=True)
            out = []
            for row in (await s.scalars(q)).all():
                row.next_attempt_at = now + claim_s
                out.append(
                    ClaimedGroup(
                        row.id,
                        row.project_id,
                        row.tenant_id,
                        row.fingerprint,
                        row.generation,
                        dict(row.sample),
                        row.previous_work_item_id,
                        row.attempts,
                    )
                )
            return out

    async def finish_group(
        self, group_id: int, generation: int, status: str, *, work_item_id: str | None = None, error: str | None = None
    ) -> None:
        """End a claimed generation: `submitted` with its item, or `failed` with why (the submission was refused)."""
        async with self.db.session() as s:
            await s.execute(
                update(ErrorGroup)
                .where(ErrorGroup.id == group_id, ErrorGroup.generation == generation, ErrorGroup.status == "pending")
                .values(
                    status=status,
                    work_item_id=work_item_id,
                    last_error=(error or None) and error[:2000],
                    attempts=ErrorGroup.attempts + 1,
                )
            )

    async def retry_group(
        self, group_id: int, generation: int, error: str, *, max_attempts: int, backoff_s: float
    ) -> str:
        async with self.db.session() as s:
            now = await self.db.now(s)
            attempts = 1 + int(await s.scalar(select(ErrorGroup.attempts).where(ErrorGroup.id == group_id)) or 0)
            status = "failed" if attempts >= max_attempts else "pending"
            await s.execute(
                update(ErrorGroup)
                .where(ErrorGroup.id == group_id, ErrorGroup.generation == generation, ErrorGroup.status == "pending")
                .values(
                    status=status,
                    attempts=attempts,
                    last_error=error[:2000],
                    next_attempt_at=now + min(300.0, backoff_s * 2 ** (attempts - 1)),
                )
            )
            return status

    async def groups(self, project_id: int, limit: int = 100) -> list[GroupRecord]:
        """The project's groups, last seen first."""
        async with self.db.session() as s:
            q = (
                select(ErrorGroup)
                .where(ErrorGroup.project_id == project_id)
                .order_by(ErrorGroup.last_seen.desc(), ErrorGroup.id.desc())
                .limit(limit)
            )
            return [
                GroupRecord(
                    r.id,
                    r.fingerprint,
                    r.title,
                    r.generation,
                    r.count,
                    r.total,
                    r.first_seen,
                    r.last_seen,
                    r.status,
                    r.work_item_id,
                    r.previous_work_item_id,
                    r.last_error,
                )
                for r in (await s.scalars(q)).all()
            ]


def _project(row: ErrorProject, url: str) -> Project:
    return Project(
        row.id,
        row.tenant_id,
        row.repository_id,
        url,
        row.public_key,
        row.fence_secret,
        dict(row.settings),
        row.created_at,
    )
