"""The append-only event log of each work item: what happened, in commit order (`events.id`).

Events that an accepted fenced write appends carry its rank (`events.rank`, see `crewwork.store.fencing`); the
few informational events written outside a fenced write (`append_event`) carry none."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text

from crewwork.boundary.masking import mask_secrets
from crewwork.store.engine import Database
from crewwork.store.tables import Event
from crewwork.store.views import StoredEvent, select_view, views_of


class EventStore(Database):
    async def append_event(
        self, work_item_id: str, tenant_id: str, type_: str, data: dict[str, Any] | None = None
    ) -> None:
        """An unfenced, informational event (secrets masked at write time)."""
        async with self.session() as s:
            s.add(
                Event(
                    work_item_id=work_item_id,
                    tenant_id=tenant_id,
                    type=type_,
                    data=mask_secrets(data or {}),
                    rank=None,
                    created_at=await self.now(s),
                )
            )

    async def list_events(self, work_item_id: str, after_id: int = 0, limit: int = 1000) -> list[StoredEvent]:
        async with self.session() as s:
            q = (
                select_view(StoredEvent, Event)
                .where(Event.work_item_id == work_item_id, Event.id > after_id)
                .order_by(Event.id)
                .limit(limit)
            )
            return await views_of(StoredEvent, s.execute(q))

    async def events_between(
        self, after_id: int, upto_id: int, *, limit: int, work_item_id: str | None = None, tenant_id: str | None = None
    ) -> list[StoredEvent]:
        """Events with `after_id < id <= upto_id` in id order, of one work item and/or one tenant (a live tail)."""
        q = select_view(StoredEvent, Event).where(Event.id > after_id, Event.id <= upto_id)
        if work_item_id is not None:
            q = q.where(Event.work_item_id == work_item_id)
        if tenant_id is not None:
            q = q.where(Event.tenant_id == tenant_id)
        async with self.session() as s:
            return await views_of(StoredEvent, s.execute(q.order_by(Event.id).limit(limit)))

    async def max_event_id(self) -> int:
        async with self.session() as s:
            return int(await s.scalar(select(func.coalesce(func.max(Event.id), 0))) or 0)

    async def event_ids_after(self, after_id: int, limit: int) -> list[int]:
        """The ids of every tenant's events after `after_id`, ascending (what the event horizon tails)."""
        async with self.session() as s:
            q = select(Event.id).where(Event.id > after_id).order_by(Event.id).limit(limit)
            return list((await s.scalars(q)).all())

    async def open_transaction_ids(self) -> set[tuple[int, str]]:
        """(backend pid, xid) of the other transactions open in this PostgreSQL database that hold an xid (that may
        still commit an event row). Empty on SQLite, whose writers are serialized."""
        if self.is_sqlite:
            return set()
        sql = text(
            "SELECT pid, backend_xid::text FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
        )
        async with self.session() as s:
            rows = (await s.execute(sql)).all()
        return {(int(p), str(x)) for p, x in rows}

    async def events_of_type(self, work_item_id: str, type_: str, limit: int = 1000) -> list[StoredEvent]:
        """The item's events of one type, oldest first (its review decisions, ...)."""
        async with self.session() as s:
            q = (
                select_view(StoredEvent, Event)
                .where(Event.work_item_id == work_item_id, Event.type == type_)
                .order_by(Event.id)
                .limit(limit)
            )
            return await views_of(StoredEvent, s.execute(q))

    async def has_event(self, work_item_id: str, type_: str, **data: Any) -> bool:
        """Whether the item has an event of `type_` whose data holds every given key with the given value."""
        for e in await self.list_events(work_item_id, limit=100_000):
            if e.type == type_ and all(e.data.get(k) == v for k, v in data.items()):
                return True
        return False
