"""Attempt records: one row per repair-loop attempt (agent outcome, validation evidence, verdict, fingerprint).

A record is written by a fenced write, so an older attempt's record can never replace a newer one; a retried
record of the same attempt replaces its own row."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.store.fencing import Accepted, AttemptRecord, FencingStore, Rank, WriteResult
from crewwork.store.tables import Attempt

__all__ = ["AttemptRecord", "AttemptStore"]


class AttemptStore(FencingStore):
    async def record_attempt(
        self, *, work_item_id: str, tenant_id: str, rank: Rank, record: AttemptRecord, writer: str
    ) -> WriteResult[list[str | None]]:
        """Insert or replace attempt `record.number`'s record. The accepted write's value is the item's failure
        fingerprints in attempt order (None for a passed attempt), read in the same transaction: what the workflow's
        same-cause breaker needs."""
        record = record.clean()
        if self.server_writes:
            res = await self._server_write(
                rank=rank,
                work_item_id=work_item_id,
                tenant_id=tenant_id,
                writer=writer,
                ops=[record.server_op(count=True), {"op": "fingerprints"}],
            )
            return res.carrying(list((res.value or {}).get("fingerprints", [])) if res.ok else None)

        async def _apply(s: AsyncSession, w: Accepted) -> list[str | None]:
            await self.write_attempt(s, w, work_item_id, tenant_id, record)
            return await self.fingerprints_in(s, work_item_id)

        return await self.fenced_write(
            rank=rank, work_item_id=work_item_id, tenant_id=tenant_id, writer=writer, apply=_apply
        )

    async def fingerprints(self, work_item_id: str) -> list[str | None]:
        async with self.session() as s:
            return await self.fingerprints_in(s, work_item_id)

    async def fingerprints_in(self, s: AsyncSession, work_item_id: str) -> list[str | None]:
        """The item's failure fingerprints in attempt order, None for a passed attempt."""
        conn = await s.connection()
        rows = await conn.execute(
            select(Attempt.verdict, Attempt.fingerprint)
            .where(Attempt.work_item_id == work_item_id)
            .order_by(Attempt.number)
        )
        return [fp if verdict != "passed" else None for verdict, fp in rows.all()]

    async def list_attempts(self, work_item_id: str) -> list[Attempt]:
        async with self.session() as s:
            q = select(Attempt).where(Attempt.work_item_id == work_item_id).order_by(Attempt.number)
            return list((await s.scalars(q)).all())
