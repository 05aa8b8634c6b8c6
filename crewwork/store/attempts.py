"""Attempt records: one row per repair-loop attempt (agent outcome, validation evidence, verdict, fingerprint).

A record is written by a fenced write (`FencingStore.record_attempt`), so an older attempt's record can never replace
a newer one; a retried record of the same attempt replaces its own row."""

from __future__ import annotations

from sqlalchemy import func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.store.fencing import AttemptRecord, FencingStore
from crewwork.store.tables import Attempt
from crewwork.store.views import StoredAttempt, select_view, views_of

__all__ = ["AttemptRecord", "AttemptStore"]


class AttemptStore(FencingStore):
    async def fingerprints(self, work_item_id: str) -> list[str | None]:
        async with self.session() as s:
            return await self.fingerprints_in(s, work_item_id)

    async def fingerprints_in(self, s: AsyncSession, work_item_id: str) -> list[str | None]:
        """The item's failure fingerprints in attempt order, None for a passed attempt."""
        return await self.writes.fingerprints_in(s, work_item_id)

    async def list_attempts(self, work_item_id: str) -> list[StoredAttempt]:
        async with self.session() as s:
            q = select_view(StoredAttempt, Attempt).where(Attempt.work_item_id == work_item_id).order_by(Attempt.number)
            return await views_of(StoredAttempt, s.execute(q))

    async def latest_attempts(self, work_item_ids: list[str]) -> dict[str, StoredAttempt]:
        """Each item's latest attempt record (the highest number), for a page of the list: one query."""
        if not work_item_ids:
            return {}
        latest = (
            select(Attempt.work_item_id, func.max(Attempt.number))
            .where(Attempt.work_item_id.in_(work_item_ids))
            .group_by(Attempt.work_item_id)
        )
        q = (
            select_view(StoredAttempt, Attempt)
            .add_columns(Attempt.work_item_id.label("of_item"))
            .where(tuple_(Attempt.work_item_id, Attempt.number).in_(latest))
        )
        async with self.session() as s:
            rows = (await s.execute(q)).all()
        out = {}
        for row in rows:
            values = row._asdict()
            item = values.pop("of_item")
            out[item] = StoredAttempt(**values)
        return out
