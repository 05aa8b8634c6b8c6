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

A terminal work item is closed: every later write is rejected (`write_after_terminal_rejected`). A stale write
changes nothing except an appended `stale_write_rejected` event naming both ranks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.masking import without_nul
from crewwork.models import WorkItemState
from crewwork.store.engine import Database
from crewwork.store.fencing_dialects import PostgresWrites, SqliteWrites
from crewwork.store.fencing_model import (
    IN_FLIGHT_STATES,
    SUBMISSION,
    Accepted,
    Admission,
    AttemptRecord,
    HandedOff,
    Rank,
    WriteResult,
)
from crewwork.store.fencing_python import PythonWrites
from crewwork.store.fencing_server import ServerWrites
from crewwork.store.tables import WorkItem
from crewwork.store.views import NewArtifact

__all__ = [
    "IN_FLIGHT_STATES",
    "SUBMISSION",
    "Accepted",
    "Admission",
    "AttemptRecord",
    "FencingStore",
    "HandedOff",
    "PythonWrites",
    "Rank",
    "WriteResult",
]

T = TypeVar("T")


class FencingStore(Database):
    """The fenced writes of a store, run by `writes`: the Python path (`SqliteWrites`, `PostgresWrites`, the
    reference, crewwork/store/fencing_python.py) or the server-side function (`ServerWrites`,
    crewwork/store/fencing_server.py), chosen by the dialect and `server_writes`. A writer's name is cleaned here, for
    every path, as the rest of a write's text is (`without_nul`): with a NUL in it the server path failed the write
    where the Python path stored it (found by tests/store/test_fencing_differential.py)."""

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
        self,
        *,
        rank: Rank,
        work_item_id: str,
        tenant_id: str,
        writer: str,
        apply: Callable[[AsyncSession, Accepted], Awaitable[T]],
    ) -> WriteResult[T]:
        """Run `apply(session, accepted)` only if `rank` is at least the highest rank accepted for the item, all in
        one transaction that holds the item row's lock (`PythonWrites.fenced_write`)."""
        return await self.writes.fenced_write(
            rank=rank, work_item_id=work_item_id, tenant_id=tenant_id, writer=without_nul(writer), apply=apply
        )

    async def fenced_event(
        self,
        *,
        rank: Rank,
        work_item_id: str,
        tenant_id: str,
        writer: str,
        type_: str,
        data: dict[str, Any],
        artifacts: Sequence[NewArtifact] = (),
    ) -> WriteResult[None]:
        """An event that only an attempt still current may append, with the artifacts it names
        (`PythonWrites.fenced_event`)."""
        return await self.writes.fenced_event(
            rank=rank,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            writer=without_nul(writer),
            type_=type_,
            data=data,
            artifacts=artifacts,
        )

    async def set_state(
        self,
        *,
        work_item_id: str,
        tenant_id: str,
        rank: Rank,
        state: WorkItemState,
        reason: str | None = None,
        writer: str,
        fields: dict[str, Any] | None = None,
        event_data: dict[str, Any] | None = None,
        max_in_flight: int | None = None,
        hand_off_cap: int = 0,
        attempt: AttemptRecord | None = None,
    ) -> WriteResult[list[HandedOff]]:
        """A fenced state change, with the item's place handed on when it leaves the in-flight states
        (`PythonWrites.set_state`)."""
        return await self.writes.set_state(
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            rank=rank,
            state=state,
            reason=reason,
            writer=without_nul(writer),
            fields=fields,
            event_data=event_data,
            max_in_flight=max_in_flight,
            hand_off_cap=hand_off_cap,
            attempt=attempt,
        )

    async def admit(
        self,
        *,
        work_item_id: str,
        tenant_id: str,
        rank: Rank,
        writer: str,
        max_in_flight: int | None,
        fingerprints: Callable[[AsyncSession, str], Awaitable[list[str | None]]],
    ) -> WriteResult[Admission]:
        """Admission in one transaction, first come, first served (`PythonWrites.admit`)."""
        return await self.writes.admit(
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            rank=rank,
            writer=without_nul(writer),
            max_in_flight=max_in_flight,
            fingerprints=fingerprints,
        )

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
