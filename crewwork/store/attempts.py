"""Attempt records: one row per repair-loop attempt (agent outcome, validation evidence, verdict, fingerprint).

A record is written by a fenced write, so an older attempt's record can never replace a newer one; a retried
record of the same attempt replaces its own row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.masking import mask_secrets
from crewwork.store.fencing import Accepted, FencingStore, Rank, WriteResult
from crewwork.store.tables import Attempt, WorkItem


@dataclass(frozen=True)
class AttemptRecord:
    """What `record_attempt` stores for one attempt (agent and validation as JSON-ready dicts)."""

    number: int
    verdict: str
    reason: str
    cause: str | None = None
    fingerprint: str | None = None
    agent: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None


class AttemptStore(FencingStore):
    async def record_attempt(
        self, *, work_item_id: str, tenant_id: str, rank: Rank, record: AttemptRecord, writer: str
    ) -> WriteResult[list[str | None]]:
        """Insert or replace attempt `record.number`'s record. The accepted write's value is the item's failure
        fingerprints in attempt order (None for a passed attempt), read in the same transaction: what the workflow's
        same-cause breaker needs."""

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

    async def write_attempt(
        self, s: AsyncSession, w: Accepted, work_item_id: str, tenant_id: str, r: AttemptRecord
    ) -> None:
        """The attempt row, the item's attempt count and an `attempt_recorded` event, in an accepted write."""
        conn = await s.connection()
        rank = w.rank.encode()
        row = {
            "rank": rank,
            "verdict": r.verdict,
            "reason": r.reason,
            "cause": r.cause,
            "fingerprint": r.fingerprint,
            "agent": mask_secrets(r.agent) if r.agent else None,
            "validation": mask_secrets(r.validation) if r.validation else None,
            "updated_at": w.now,
        }
        ins = (sqlite.insert if self.is_sqlite else postgresql.insert)(Attempt).values(
            work_item_id=work_item_id, number=r.number, created_at=w.now, **row
        )
        await conn.execute(ins.on_conflict_do_update(index_elements=[Attempt.work_item_id, Attempt.number], set_=row))
        greatest = func.max if self.is_sqlite else func.greatest
        await conn.execute(
            update(WorkItem)
            .where(WorkItem.id == work_item_id)
            .values(attempt_count=greatest(WorkItem.attempt_count, r.number), updated_at=w.now)
        )
        diff_ref = ((r.agent or {}).get("diff_ref") or {}).get("id")
        await self.insert_event(
            s,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            type="attempt_recorded",
            data={"number": r.number, "verdict": r.verdict, "reason": r.reason, "cause": r.cause, "diff_ref": diff_ref},
            rank=rank,
            created_at=w.now,
        )

    async def list_attempts(self, work_item_id: str) -> list[Attempt]:
        async with self.session() as s:
            q = select(Attempt).where(Attempt.work_item_id == work_item_id).order_by(Attempt.number)
            return list((await s.scalars(q)).all())
