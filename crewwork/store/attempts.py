"""Attempt records: one row per repair-loop attempt (agent outcome, validation evidence, verdict, fingerprint).

A record is written by a fenced write, so an older attempt's record can never replace a newer one; a retried
record of the same attempt replaces its own row."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.masking import without_nul
from crewwork.store.fencing import AttemptRecord, FencingStore, Rank, WriteResult
from crewwork.store.tables import Attempt
from crewwork.store.views import StoredAttempt, select_view, views_of

__all__ = ["AttemptRecord", "AttemptStore"]


class AttemptStore(FencingStore):
    async def record_attempt(
        self, *, work_item_id: str, tenant_id: str, rank: Rank, record: AttemptRecord, writer: str
    ) -> WriteResult[list[str | None]]:
        """Insert or replace attempt `record.number`'s record. The accepted write's value is the item's failure
        fingerprints in attempt order (None for a passed attempt), read in the same transaction: what the workflow's
        same-cause breaker needs."""
        return await self.writes.record_attempt(
            work_item_id=work_item_id, tenant_id=tenant_id, rank=rank, record=record, writer=without_nul(writer)
        )

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
