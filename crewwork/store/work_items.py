"""Work items: the submitted row (inserted by the API at rank 0, before its workflow starts) and its reads."""

from __future__ import annotations

from sqlalchemy import func, select, tuple_
from sqlalchemy.exc import IntegrityError

from crewwork.ids import new_id
from crewwork.masking import mask_secrets
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.engine import Database
from crewwork.store.fencing import IN_FLIGHT_STATES, SUBMISSION
from crewwork.store.tables import Event, WorkItem


class WorkItemStore(Database):
    async def create_work_item(
        self,
        *,
        tenant_id: str,
        spec: WorkItemSpec,
        base_commit: str | None,
        repo_path: str | None,
        workflow_id_prefix: str = "work-item-",
    ) -> tuple[WorkItem, bool]:
        """Insert a work item, or return the existing one for the same (tenant, idempotency key).

        Returns (row, created)."""
        if spec.idempotency_key:
            found = await self._by_idempotency(tenant_id, spec.idempotency_key)
            if found is not None:
                return found, False
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
                    labels=dict(spec.labels),
                    repo_url=repo_path,
                    base_commit=base_commit,
                    workflow_id=f"{workflow_id_prefix}{wid}",
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
                found = await self._by_idempotency(tenant_id, spec.idempotency_key)
                if found is not None:
                    return found, False
            raise

    async def _by_idempotency(self, tenant_id: str, key: str) -> WorkItem | None:
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
        tenant_id: str,
        *,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        state: str | None = None,
        kind: str | None = None,
    ) -> list[WorkItem]:
        """Newest first, keyset-paginated on (created_at, id)."""
        async with self.session() as s:
            q = select(WorkItem).where(WorkItem.tenant_id == tenant_id)
            if state:
                q = q.where(WorkItem.state == state)
            if kind:
                q = q.where(WorkItem.kind == kind)
            if before is not None:
                q = q.where(tuple_(WorkItem.created_at, WorkItem.id) < tuple_(*before))
            q = q.order_by(WorkItem.created_at.desc(), WorkItem.id.desc()).limit(limit)
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
