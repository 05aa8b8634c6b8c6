"""Fencing in Temporal's scheduling order: every write to a work item is ranked by when Temporal *scheduled* it.

The workflow numbers its steps deterministically (a counter in workflow state, carried across continue-as-new) and
passes the step number in each activity's input; an activity attempt writes with the rank (step, Temporal attempt).
`fenced_write` locks the work item's row, and accepts the write only if its rank is at least the highest rank
accepted for the item so far (`work_items.fence_rank`), then raises that mark. So an attempt that wakes late (a
paused process, a slow start, a retry Temporal already gave up on) is rejected at its *first* write, whenever it
wakes: its rank was fixed when it was scheduled, and anything scheduled after it ranks higher. Equal ranks are the
same scheduled attempt (a local activity re-run after its workflow task moved to another worker): its input is the
same deterministic value, so accepting both copies is harmless.

Kleppmann's fencing token comes from the lock service; here the lock service is Temporal, which alone decides
which attempt of which step is current. The database only compares and keeps the highest rank: it issues nothing
(docs/reliability.md, "Fencing in scheduling order").

Every fenced write presents a `FencedWrite` (item, tenant, rank, writer); a state change is one `StateChange`
value (crewwork/store/fencing/vocabulary.py), built where the write starts and carried unchanged through whichever
path runs it.

A terminal work item is closed: every later write is rejected (`write_after_terminal_rejected`). A stale write
changes nothing except an appended `stale_write_rejected` event naming both ranks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.boundary.masking import mask_secrets, without_nul
from crewwork.store.engine import Database
from crewwork.store.fencing.dialects import PostgresWrites, SqliteWrites
from crewwork.store.fencing.reference import PythonWrites
from crewwork.store.fencing.server_side import ServerWrites
from crewwork.store.fencing.vocabulary import (
    Accepted,
    Admission,
    AttemptRecord,
    FencedWrite,
    HandedOff,
    Rank,
    StateChange,
    WriteResult,
)
from crewwork.store.outbox import enqueue as enqueue_webhooks
from crewwork.store.tables import WorkItem
from crewwork.store.views import NewArtifact

T = TypeVar("T")

REVIEW_EVENT = "review_decided"
"""The event a reviewer's decision is stored as (`FencingStore.record_review`)."""
REVIEW_WEBHOOK = "work_item.reviewed"
"""Its webhook event type."""


class FencingStore(Database):
    """The fenced writes of a store, run by `writes`: the Python path (`SqliteWrites`, `PostgresWrites`, the
    reference, crewwork/store/fencing/reference.py) or the server-side function (`ServerWrites`,
    crewwork/store/fencing/server_side.py), chosen by the dialect and `server_writes`. Each write is handed to the
    path as the value it was built as: a writer's name is made storable when its `FencedWrite` is built, as the rest
    of a write's text is (with a NUL in it the server path failed the write where the Python path stored it: found
    by tests/store/test_fencing_differential.py)."""

    writes: PythonWrites

    @property
    def server_writes(self) -> bool:
        """PostgreSQL: fenced writes run as one call of a server-side function (migration 0008) instead of one round
        trip per statement. False (the setting `CREWWORK_STORE_SERVER_WRITES`) runs the Python path, which SQLite
        always runs (docs/performance.md, "Fourth round")."""
        return isinstance(self.writes, ServerWrites)

    @server_writes.setter
    def server_writes(self, value: bool) -> None:
        if self.is_sqlite:
            self.writes = SqliteWrites(self)
        else:
            self.writes = ServerWrites(self) if value else PostgresWrites(self)

    async def fenced_write(
        self, write: FencedWrite, apply: Callable[[AsyncSession, Accepted], Awaitable[T]]
    ) -> WriteResult[T]:
        """Run `apply(session, accepted)` only if `write.rank` is at least the highest rank accepted for the item, all
        in one transaction that holds the item row's lock (`PythonWrites.fenced_write`)."""
        return await self.writes.fenced_write(write, apply)

    async def fenced_event(
        self, write: FencedWrite, type_: str, data: dict[str, Any], artifacts: Sequence[NewArtifact] = ()
    ) -> WriteResult[None]:
        """An event that only an attempt still current may append, with the artifacts it names
        (`PythonWrites.fenced_event`)."""
        return await self.writes.fenced_event(write, type_, data, artifacts)

    async def record_review(self, write: FencedWrite, review: dict[str, Any]) -> WriteResult[None]:
        """A reviewer's decision as the workflow took it (`crewwork.models.review.ReviewRecord`, as JSON): the item's
        `review_decided` event and, in the same transaction, a `work_item.reviewed` notification for each of the
        tenant's webhooks that wants one. The Python path on every database (a review is rare; it has no
        server-side twin to keep equal)."""
        review = without_nul(review)

        async def apply(s: AsyncSession, w: Accepted) -> None:
            await self.writes.insert_event(
                s,
                work_item_id=write.work_item_id,
                tenant_id=write.tenant_id,
                type=REVIEW_EVENT,
                data=write.event(review),
                rank=w.rank.encode(),
                created_at=w.now,
            )
            await enqueue_webhooks(
                s,
                tenant_id=write.tenant_id,
                work_item_id=write.work_item_id,
                event_type=REVIEW_WEBHOOK,
                payload=mask_secrets({"work_item_id": write.work_item_id, "review": review, "occurred_at": w.now}),
                now=w.now,
            )

        return await self.fenced_write(write, apply)

    async def set_state(self, change: StateChange) -> WriteResult[list[HandedOff]]:
        """A fenced state change, with the item's place handed on when it leaves the in-flight states
        (`PythonWrites.set_state`)."""
        return await self.writes.set_state(change)

    async def admit(
        self,
        write: FencedWrite,
        max_in_flight: int | None,
        fingerprints: Callable[[AsyncSession, str], Awaitable[list[str | None]]],
    ) -> WriteResult[Admission]:
        """Admission in one transaction, first come, first served (`PythonWrites.admit`)."""
        return await self.writes.admit(write, max_in_flight, fingerprints)

    async def record_attempt(self, write: FencedWrite, record: AttemptRecord) -> WriteResult[list[str | None]]:
        """Insert or replace attempt `record.number`'s record. The accepted write's value is the item's failure
        fingerprints in attempt order (None for a passed attempt), read in the same transaction: what the workflow's
        same-cause breaker needs (`PythonWrites.record_attempt`)."""
        return await self.writes.record_attempt(write, record)

    async def current_rank(self, work_item_id: str) -> tuple[Rank, str] | None:
        """The item's highest accepted rank and its state (what an attempt probes to learn it was superseded)."""
        async with self.session() as s:
            conn = await s.connection()
            row = (
                await conn.execute(
                    select(WorkItem.fence_rank, WorkItem.state).where(WorkItem.id == bindparam("wid")),
                    {"wid": work_item_id},
                )
            ).first()
        return None if row is None else (Rank.decode(int(row[0])), str(row[1]))
