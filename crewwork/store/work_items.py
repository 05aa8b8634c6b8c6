"""Work items: the submitted row (inserted by the API at rank 0, before its workflow starts) and its reads."""

from __future__ import annotations

from sqlalchemy import JSON, cast, func, or_, select, tuple_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError

from crewwork.ids import new_id
from crewwork.masking import mask_secrets
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.engine import Database, StoreError
from crewwork.store.fencing import IN_FLIGHT_STATES, SUBMISSION
from crewwork.store.tables import Event, WorkItem


class IdempotencyConflict(StoreError):
    """The tenant already submitted another payload with this idempotency key."""

    def __init__(self, existing: WorkItem) -> None:
        super().__init__(
            f"idempotency key already used for work item {existing.id} with a different submission; "
            "use a new key for a new submission"
        )
        self.existing = existing


def _replay(found: WorkItem, submission_hash: str | None) -> WorkItem:
    """The earlier item for a repeated key, if the submission is the same (rows from before migration 0007 have no
    hash and are taken as the same)."""
    if found.submission_hash and submission_hash and found.submission_hash != submission_hash:
        raise IdempotencyConflict(found)
    return found


class WorkItemStore(Database):
    async def create_work_item(
        self,
        *,
        tenant_id: str,
        spec: WorkItemSpec,
        base_commit: str | None,
        repo_path: str | None,
        submission_hash: str | None = None,
    ) -> tuple[WorkItem, bool]:
        """Insert a work item, or return the existing one for the same (tenant, idempotency key) if its
        `submission_hash` is the same (else `IdempotencyConflict`).

        Returns (row, created)."""
        if spec.idempotency_key:
            found = await self.work_item_by_idempotency_key(tenant_id, spec.idempotency_key)
            if found is not None:
                return _replay(found, submission_hash), False
        wid = new_id("wi")
        try:
            async with self.session() as s:
                now = await self.now(s)
                row = WorkItem(
                    id=wid,
                    tenant_id=tenant_id,
                    kind=spec.kind.value,
                    state=WorkItemState.submitted.value,
                    spec=spec.model_dump(mode="json"),
                    idempotency_key=spec.idempotency_key,
                    submission_hash=submission_hash,
                    labels=dict(spec.labels),
                    repo_url=repo_path,
                    base_commit=base_commit,
                    workflow_id=f"work-item-{wid}",
                    reason="",
                    attempt_count=0,
                    mock=False,
                    fence_rank=SUBMISSION.encode(),
                    created_at=now,
                    updated_at=now,
                )
                s.add(row)
                s.add(
                    Event(
                        work_item_id=wid,
                        tenant_id=tenant_id,
                        type="submitted",
                        data=mask_secrets({"kind": spec.kind.value, "base_commit": base_commit}),
                        rank=SUBMISSION.encode(),
                        created_at=now,
                    )
                )
            return row, True
        except IntegrityError:
            if spec.idempotency_key:
                found = await self.work_item_by_idempotency_key(tenant_id, spec.idempotency_key)
                if found is not None:
                    return _replay(found, submission_hash), False
            raise

    async def work_item_by_idempotency_key(self, tenant_id: str, key: str) -> WorkItem | None:
        async with self.session() as s:
            return await s.scalar(
                select(WorkItem).where(WorkItem.tenant_id == tenant_id, WorkItem.idempotency_key == key)
            )

    async def get_work_item(self, work_item_id: str, tenant_id: str | None = None) -> WorkItem | None:
        async with self.session() as s:
            q = select(WorkItem).where(WorkItem.id == work_item_id)
            if tenant_id is not None:
                q = q.where(WorkItem.tenant_id == tenant_id)
            return await s.scalar(q)

    async def list_work_items(
        self,
        tenant_id: str | None,
        *,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        state: str | None = None,
        kind: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        labels: dict[str, str] | None = None,
        search: str | None = None,
    ) -> list[WorkItem]:
        """Newest first, keyset-paginated on (created_at, id): the items strictly before `before`. `tenant_id`
        None is every tenant's (an admin's listing). `labels` must all match; `search` is an id prefix or text in
        the repository locator."""
        q = select(WorkItem)
        if tenant_id is not None:
            q = q.where(WorkItem.tenant_id == tenant_id)
        if state:
            q = q.where(WorkItem.state == state)
        if kind:
            q = q.where(WorkItem.kind == kind)
        if created_after is not None:
            q = q.where(WorkItem.created_at >= created_after)
        if created_before is not None:
            q = q.where(WorkItem.created_at < created_before)
        if labels:
            if self.is_sqlite:
                for k, v in labels.items():
                    q = q.where(func.json_extract(WorkItem.labels, f'$."{k.replace(chr(34), "")}"') == v)
            else:
                q = q.where(cast(WorkItem.labels, JSONB).op("@>")(cast(cast(labels, JSON), JSONB)))
        if search:
            like = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            q = q.where(
                or_(WorkItem.id.like(f"{like}%", escape="\\"), WorkItem.repo_url.like(f"%{like}%", escape="\\"))
            )
        if before is not None:
            # A row-value comparison, so PostgreSQL seeks the (tenant, created_at, id) index instead of filtering.
            q = q.where(tuple_(WorkItem.created_at, WorkItem.id) < tuple_(*before))
        q = q.order_by(WorkItem.created_at.desc(), WorkItem.id.desc()).limit(limit)
        async with self.session() as s:
            return list((await s.scalars(q)).all())

    async def queued_work_items(self, tenant_id: str, limit: int) -> list[WorkItem]:
        """The tenant's queued items, oldest first (the next to admit when a place frees)."""
        async with self.session() as s:
            q = (
                select(WorkItem)
                .where(WorkItem.tenant_id == tenant_id, WorkItem.state == WorkItemState.queued.value)
                .order_by(WorkItem.created_at, WorkItem.id)
                .limit(limit)
            )
            return list((await s.scalars(q)).all())

    async def queued_to_wake(self, tenant_id: str, max_in_flight: int, cap: int) -> list[WorkItem]:
        """The tenant's first queued items, as many as there are free in-flight places (at most `cap`): the ones
        admission would take now. Waking more only makes them re-run admission to be queued again."""
        async with self.session() as s:
            in_flight = int(
                await s.scalar(
                    select(func.count())
                    .select_from(WorkItem)
                    .where(WorkItem.tenant_id == tenant_id, WorkItem.state.in_(IN_FLIGHT_STATES))
                )
                or 0
            )
            free = min(cap, max_in_flight - in_flight)
            if free <= 0:
                return []
            q = (
                select(WorkItem)
                .where(WorkItem.tenant_id == tenant_id, WorkItem.state == WorkItemState.queued.value)
                .order_by(WorkItem.created_at, WorkItem.id)
                .limit(free)
            )
            return list((await s.scalars(q)).all())
