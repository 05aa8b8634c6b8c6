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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy import bindparam, func, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from crewwork.masking import mask_secrets
from crewwork.models import WorkItemState
from crewwork.store.artifacts import insert_artifacts
from crewwork.store.engine import Database
from crewwork.store.tables import Event, Tenant, WorkItem

T = TypeVar("T")

_EVENT_INSERT = insert(Event)

# States that hold a share of the pools: what a tenant's in-flight limit counts. An item awaiting review holds
# nothing (a person may take days), and a queued or submitted one is waiting for exactly this.
IN_FLIGHT_STATES = (
    WorkItemState.admitted.value,
    WorkItemState.running.value,
    WorkItemState.validating.value,
    WorkItemState.landing.value,
)


@dataclass(frozen=True, order=True)
class Rank:
    """When Temporal scheduled a write: the workflow's step number, then the activity's attempt (from 1)."""

    step: int
    attempt: int

    SPAN: ClassVar[int] = 1_000_000
    """Attempts per step the integer encoding leaves room for (retry policies allow at most a handful)."""

    def __post_init__(self) -> None:
        if self.step < 0 or not 0 <= self.attempt < self.SPAN:
            raise ValueError(f"rank out of range: step {self.step}, attempt {self.attempt}")

    def encode(self) -> int:
        """One integer that orders like the pair (stored in `fence_rank`, `events.rank`, `attempts.rank`)."""
        return self.step * self.SPAN + self.attempt

    @classmethod
    def decode(cls, value: int) -> Rank:
        return cls(value // cls.SPAN, value % cls.SPAN)

    def as_dict(self) -> dict[str, int]:
        return {"step": self.step, "attempt": self.attempt}

    def __str__(self) -> str:
        return f"step {self.step} attempt {self.attempt}"


SUBMISSION = Rank(0, 0)
"""The rank of the API's insert of a submitted item: below every step the workflow schedules."""


@dataclass
class WriteResult(Generic[T]):
    ok: bool
    """False when the write was rejected (nothing was changed)."""
    value: T | None = None
    current: Rank | None = None
    """The item's highest accepted rank when the write was checked."""
    closed: bool = False
    """Rejected because the work item is already terminal."""
    missing: bool = False
    """Rejected because the work item is not in the store."""
    state: str | None = None
    """The work item's state when the write was checked (before it was applied)."""

    @property
    def stale(self) -> bool:
        return not self.ok


@dataclass
class Accepted:
    """What an accepted write's `apply` gets: the database clock and the rank it writes with."""

    now: float
    rank: Rank
    mark_raised: bool = field(default=False)
    """Set once the item row's `fence_rank` has been raised to `rank` in this transaction (by `change_state`)."""


@dataclass(frozen=True)
class Admission:
    admitted: bool
    queued_position: int | None = None
    """1-based place among the tenant's queued items when not admitted (the in-flight limit is reached)."""
    in_flight: int = 0
    fingerprints: list[str | None] = field(default_factory=list)


class FencingStore(Database):
    async def insert_event(self, s: AsyncSession, **values: Any) -> None:
        """Append an event inside the caller's transaction with a Core INSERT (the ORM's unit of work cost ~0.3 ms
        of CPU per flush on this hot path)."""
        conn = await s.connection()
        await conn.execute(_EVENT_INSERT, values)

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
        one transaction that holds the item row's lock (PostgreSQL `FOR UPDATE`, SQLite `BEGIN IMMEDIATE`)."""
        presented = rank.encode()

        async def body(s: AsyncSession, started: Callable[[], None]) -> WriteResult[T]:
            conn = await s.connection()
            row = (
                await conn.execute(
                    select(WorkItem.state, WorkItem.fence_rank, self.now_sql())
                    .where(WorkItem.id == bindparam("wid"))
                    .with_for_update(of=WorkItem),
                    {"wid": work_item_id},
                )
            ).first()
            started()
            if row is None:
                return WriteResult(ok=False, missing=True)
            state, mark, now = row[0], int(row[1]), float(row[2])
            current = Rank.decode(mark)
            rejected = {"writer": writer, "presented": rank.as_dict()}
            if presented < mark:
                await self.insert_event(
                    s,
                    work_item_id=work_item_id,
                    tenant_id=tenant_id,
                    type="stale_write_rejected",
                    data={**rejected, "current": current.as_dict()},
                    rank=presented,
                    created_at=now,
                )
                return WriteResult(ok=False, current=current, state=state)
            if WorkItemState(state).terminal:
                # A zombie attempt that only wakes after its item finished must not reopen it.
                await self.insert_event(
                    s,
                    work_item_id=work_item_id,
                    tenant_id=tenant_id,
                    type="write_after_terminal_rejected",
                    data={**rejected, "current": current.as_dict(), "state": state},
                    rank=presented,
                    created_at=now,
                )
                return WriteResult(ok=False, current=current, closed=True, state=state)
            accepted = Accepted(now=now, rank=rank)
            value = await apply(s, accepted)
            if presented > mark and not accepted.mark_raised:
                await conn.execute(
                    update(WorkItem).where(WorkItem.id == bindparam("wid")).values(fence_rank=bindparam("rank")),
                    {"wid": work_item_id, "rank": presented},
                )
            return WriteResult(ok=True, value=value, current=current, state=state)

        return await self.transaction(body)

    async def fenced_event(
        self,
        *,
        rank: Rank,
        work_item_id: str,
        tenant_id: str,
        writer: str,
        type_: str,
        data: dict[str, Any],
        artifacts: Sequence[dict[str, Any]] = (),
    ) -> WriteResult[None]:
        """An event that only an attempt still current may append (what an attempt produced: its evidence refs),
        with the artifacts it names (rows from `artifact_row`) in the same transaction."""

        async def _apply(s: AsyncSession, w: Accepted) -> None:
            await insert_artifacts(s, artifacts, w.now)
            await self.insert_event(
                s,
                work_item_id=work_item_id,
                tenant_id=tenant_id,
                type=type_,
                data=mask_secrets({**data, "writer": writer}),
                rank=w.rank.encode(),
                created_at=w.now,
            )

        return await self.fenced_write(
            rank=rank, work_item_id=work_item_id, tenant_id=tenant_id, writer=writer, apply=_apply
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
        before: Callable[[AsyncSession, Accepted], Awaitable[None]] | None = None,
    ) -> WriteResult[None]:
        """A fenced state change. `before` runs first in the same transaction (a `task` item's last attempt record
        and its result: one write)."""

        async def _apply(s: AsyncSession, w: Accepted) -> None:
            if before is not None:
                await before(s, w)
            await self.change_state(s, w, work_item_id, tenant_id, state, reason, writer, fields, event_data)

        return await self.fenced_write(
            rank=rank, work_item_id=work_item_id, tenant_id=tenant_id, writer=writer, apply=_apply
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
        """Admission in one transaction: `submitted`/`queued` -> `admitted` if the tenant has fewer than
        `max_in_flight` items in flight counting every queued item submitted before this one (first come, first
        served), else -> `queued`. An item already further on (a continued run) stays as it is. The value carries the
        item's failure fingerprints so far (`fingerprints`), for the breaker. Rejected with `missing` when the item
        is not in the store, `closed` when it is already terminal."""

        async def _apply(s: AsyncSession, w: Accepted) -> Admission:
            conn = await s.connection()
            me = (
                await conn.execute(select(WorkItem.state, WorkItem.created_at).where(WorkItem.id == work_item_id))
            ).one()
            waiting = me.state in (WorkItemState.submitted.value, WorkItemState.queued.value)
            if not waiting:
                return Admission(admitted=True, fingerprints=await fingerprints(s, work_item_id))
            in_flight = ahead = 0
            if max_in_flight is not None:
                # Serialise the tenant's admissions so two of them cannot both take the last free place.
                await conn.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
                in_flight = int(
                    await conn.scalar(
                        select(func.count())
                        .select_from(WorkItem)
                        .where(WorkItem.tenant_id == tenant_id, WorkItem.state.in_(IN_FLIGHT_STATES))
                    )
                    or 0
                )
                ahead = int(
                    await conn.scalar(
                        select(func.count())
                        .select_from(WorkItem)
                        .where(
                            WorkItem.tenant_id == tenant_id,
                            WorkItem.state == WorkItemState.queued.value,
                            # Row values: both databases seek the (tenant, state, created_at, id) index.
                            tuple_(WorkItem.created_at, WorkItem.id) < tuple_(me.created_at, work_item_id),
                        )
                    )
                    or 0
                )
            if max_in_flight is not None and in_flight + ahead >= max_in_flight:
                reason = f"queued: {in_flight} of the tenant's {max_in_flight} in-flight places taken, {ahead} ahead"
                if me.state != WorkItemState.queued.value:
                    await self.change_state(
                        s, w, work_item_id, tenant_id, WorkItemState.queued, reason, writer, None, None
                    )
                return Admission(admitted=False, queued_position=ahead + 1, in_flight=in_flight)
            await self.change_state(
                s, w, work_item_id, tenant_id, WorkItemState.admitted, "admitted", writer, None, None
            )
            return Admission(admitted=True, in_flight=in_flight + 1, fingerprints=await fingerprints(s, work_item_id))

        return await self.fenced_write(
            rank=rank, work_item_id=work_item_id, tenant_id=tenant_id, writer=writer, apply=_apply
        )

    async def change_state(
        self,
        s: AsyncSession,
        w: Accepted,
        work_item_id: str,
        tenant_id: str,
        state: WorkItemState,
        reason: str | None,
        writer: str,
        fields: dict[str, Any] | None,
        event_data: dict[str, Any] | None,
    ) -> None:
        """The state change of an accepted fenced write: the row (with its raised fencing mark), its
        `state_changed` event and the webhook outbox rows, in the caller's transaction."""
        rank = w.rank.encode()
        values: dict[str, Any] = {"state": state.value, "updated_at": w.now, "state_rank": rank, "fence_rank": rank}
        if reason is not None:
            values["reason"] = reason
        if fields:
            values.update(fields)
            if "result" in fields:
                values["result_rank"] = rank
        conn = await s.connection()
        await conn.execute(update(WorkItem).where(WorkItem.id == work_item_id).values(**values))
        w.mark_raised = True
        await self.insert_event(
            s,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            type="state_changed",
            data=mask_secrets({"state": state.value, "reason": reason or "", "writer": writer, **(event_data or {})}),
            rank=rank,
            created_at=w.now,
        )
        # Webhooks outbox: notifications commit atomically with the change they announce.
        from crewwork.store.outbox import enqueue as _enqueue_webhooks

        await _enqueue_webhooks(
            s,
            tenant_id=tenant_id,
            work_item_id=work_item_id,
            event_type="work_item.state_changed",
            payload=mask_secrets(
                {
                    "work_item_id": work_item_id,
                    "state": state.value,
                    "reason": reason or "",
                    "occurred_at": w.now,
                    **_delivery(fields),
                }
            ),
            now=w.now,
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


def _delivery(fields: dict[str, Any] | None) -> dict[str, Any]:
    """Where a landed change went (branch, commit, pull request), for the webhook of the state change that says so."""
    if not fields:
        return {}
    result = fields.get("result") if isinstance(fields.get("result"), dict) else {}
    out = {
        "delivery_branch": fields.get("delivery_branch"),
        "landed_commit": fields.get("landed_commit"),
        "pull_request_url": (result or {}).get("pull_request_url"),
    }
    return {k: v for k, v in out.items() if v}
