"""The append-only event log of each work item: what happened, in commit order (`events.id`).

Events that an accepted fenced write appends carry its rank (`events.rank`, see `crewwork.store.fencing`); the
few informational events written outside a fenced write (`append_event`) carry none."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from crewwork.masking import mask_secrets
from crewwork.store.engine import Database
from crewwork.store.tables import Event


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

    async def list_events(self, work_item_id: str, after_id: int = 0, limit: int = 1000) -> list[Event]:
        async with self.session() as s:
            q = (
                select(Event)
                .where(Event.work_item_id == work_item_id, Event.id > after_id)
                .order_by(Event.id)
                .limit(limit)
            )
            return list((await s.scalars(q)).all())

    async def has_event(self, work_item_id: str, type_: str, **data: Any) -> bool:
        """Whether the item has an event of `type_` whose data holds every given key with the given value."""
        for e in await self.list_events(work_item_id, limit=100_000):
            if e.type == type_ and all(e.data.get(k) == v for k, v in data.items()):
                return True
        return False
