"""The fenced write as Python statements, the reference implementation of the fencing rules (crewwork/store/fencing/
rule.py): every rule is written here once. What differs between databases is a subclass's (`SqliteWrites`,
`PostgresWrites` in dialects.py, and `ServerWrites` in server_side.py, which runs the same rules as one call of a
server-side function; tests/store/test_fencing_differential.py proves the two agree). Every write takes its values
(`FencedWrite`, `StateChange`, `AttemptRecord`: vocabulary.py) as they were built, and records what their own
methods say it records."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Select, Table, bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ClauseElement

from crewwork.models import WorkItemState
from crewwork.store.artifacts import insert_artifacts
from crewwork.store.fencing import sql
from crewwork.store.fencing.vocabulary import (
    IN_FLIGHT_STATES,
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
from crewwork.store.tables import Artifact, Attempt, WorkItem
from crewwork.store.views import NewArtifact

if TYPE_CHECKING:
    from crewwork.store.engine import Database

T = TypeVar("T")


class PythonWrites:
    """The fenced writes of one store, statement by statement in the worker (`db`: the store's engine)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._fence_select: Select[Any] | None = None
        self._state_updates: dict[tuple[str, ...], Any] = {}

    # What differs between dialects.

    def with_event(self, stmt: Any) -> Any:
        """`stmt` made ready for `execute_with_event(..., ready=True)`: built once and kept, so that its cache key
        is computed once too."""
        raise NotImplementedError

    async def execute_with_event(
        self, s: AsyncSession, stmt: Any, params: dict[str, Any], event: dict[str, Any], *, ready: bool = False
    ) -> Any:
        """Execute `stmt` (an INSERT or UPDATE, with `params`) and append `event` (the columns of an `events` row),
        in the caller's transaction. `ready`: `stmt` came from `with_event` already. Returns the statement's
        (buffered) result."""
        raise NotImplementedError

    def attempt_count_at_least(self, number: int) -> Any:
        """The work item's `attempt_count` raised to `number` (a value for an UPDATE of the item's row)."""
        raise NotImplementedError

    def insert(self, table: Any) -> Any:
        """An INSERT with `on_conflict_do_update`."""
        raise NotImplementedError

    # The rules.

    def _fence_statement(self) -> Select[Any]:
        """The fenced write's first statement: lock the item row, read its state, mark and submission time and the
        database clock, in one round trip."""
        if self._fence_select is None:
            self._fence_select = (
                select(WorkItem.state, WorkItem.fence_rank, self.db.now_sql(), WorkItem.created_at)
                .where(WorkItem.id == bindparam("wid"))
                .with_for_update(of=WorkItem)
            )
        return self._fence_select

    async def insert_event(self, s: AsyncSession, **values: Any) -> None:
        """Append an event inside the caller's transaction with a Core INSERT (the ORM's unit of work cost ~0.3 ms
        of CPU per flush on this hot path)."""
        conn = await s.connection()
        await conn.execute(sql.EVENT_INSERT, values)

    def _state_update(self, keys: tuple[str, ...]) -> Any:
        """The state change's UPDATE (made ready by `with_event`) for these columns, every value a bound parameter
        `v_<column>`: built once per set of columns. Built per call, its construction and cache key were about a
        tenth of a millisecond of CPU per change."""
        stmt = self._state_updates.get(keys)
        if stmt is None:
            t: Table = WorkItem.__table__  # type: ignore[assignment]
            stmt = self.with_event(
                update(t)
                .where(t.c.id == bindparam("wid"))
                .values({k: bindparam(f"v_{k}", type_=t.c[k].type) for k in keys})
                .returning(sql.HAS_WEBHOOKS)
            )
            self._state_updates[keys] = stmt
        return stmt

    async def fenced_write(
        self, write: FencedWrite, apply: Callable[[AsyncSession, Accepted], Awaitable[T]]
    ) -> WriteResult[T]:
        """Run `apply(session, accepted)` only if `write.rank` is at least the highest rank accepted for the item, all
        in one transaction that holds the item row's lock (PostgreSQL `FOR UPDATE`, SQLite `BEGIN IMMEDIATE`)."""
        rank, work_item_id, tenant_id = write.rank, write.work_item_id, write.tenant_id
        presented = rank.encode()

        async def body(s: AsyncSession, started: Callable[[], None]) -> WriteResult[T]:
            conn = await s.connection()
            row = (await conn.execute(self._fence_statement(), {"wid": work_item_id})).first()
            started()
            if row is None:
                return WriteResult(ok=False, missing=True)
            state, mark, now = row[0], int(row[1]), float(row[2])
            current = Rank.decode(mark)
            rejected = {"writer": write.writer, "presented": rank.as_dict()}
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
            accepted = Accepted(now=now, rank=rank, state=state, created_at=float(row[3]))
            value = await apply(s, accepted)
            if presented > mark and not accepted.mark_raised:
                await conn.execute(sql.RAISE_MARK, {"wid": work_item_id, "rank": presented})
            return WriteResult(ok=True, value=value, current=current, state=state)

        return await self.db.transaction(body)

    async def fenced_event(
        self, write: FencedWrite, type_: str, data: dict[str, Any], artifacts: Sequence[NewArtifact] = ()
    ) -> WriteResult[None]:
        """An event that only an attempt still current may append (what an attempt produced: its evidence refs),
        with the artifacts it names (made by `new_artifact`) in the same transaction."""
        recorded = write.event(data)

        async def _apply(s: AsyncSession, w: Accepted) -> None:
            event = {
                "work_item_id": write.work_item_id,
                "tenant_id": write.tenant_id,
                "type": type_,
                "data": recorded,
                "rank": w.rank.encode(),
                "created_at": w.now,
            }
            if len(artifacts) == 1:
                # An attempt's transcript: the artifact and its event in one statement.
                row = {**artifacts[0].columns(), "created_at": w.now}
                await self.execute_with_event(s, insert(Artifact).values(**row), {}, event)
                return
            await insert_artifacts(s, artifacts, w.now)
            await self.insert_event(s, **event)

        return await self.fenced_write(write, _apply)

    async def set_state(self, change: StateChange) -> WriteResult[list[HandedOff]]:
        """A fenced state change. `change.attempt` is written first in the same write (a `task` item's last attempt
        record with its result: one write), with the item's attempt count raised to it by the change itself. When the
        change takes the item out of the in-flight states, its place goes to the tenant's first queued items in the
        same transaction (`hand_off`, at most `hand_off_cap` of them); the value lists them, for the caller to tell
        their workflows. A queued item that ends (cancelled) hands on the free places too: a hand-off that found its
        row locked left it one."""
        write, record, max_in_flight = change.write, change.attempt, change.max_in_flight

        async def _apply(s: AsyncSession, w: Accepted) -> None:
            if record is not None:
                await self.write_attempt(s, w, write, record, count=False)
            await self.change_state(s, w, change)

        async def _apply_and_hand_off(s: AsyncSession, w: Accepted) -> list[HandedOff]:
            if (
                max_in_flight is None
                or not change.hands_off
                # Only an item that held a place hands it on, or a queued one leaving the queue: a hand-off that
                # found its row locked (this write) left it a place, which now goes to the next in line.
                or (w.state not in IN_FLIGHT_STATES and w.state != WorkItemState.queued.value)
            ):
                await _apply(s, w)
                return []
            # The tenant lock first: a wait for it comes before the item's own change, so that change (and its
            # webhook lookup) is not followed by a wait of unbounded length before the commit.
            conn = await s.connection()
            await conn.execute(sql.TENANT_LOCK, {"tenant": write.tenant_id})
            await _apply(s, w)
            return await self.hand_off(
                s, w, write.tenant_id, write.work_item_id, max_in_flight, change.hand_off_cap, tenant_locked=True
            )

        return await self.fenced_write(write, _apply_and_hand_off)

    async def hand_off(
        self,
        s: AsyncSession,
        w: Accepted,
        tenant_id: str,
        from_item: str,
        max_in_flight: int,
        cap: int,
        *,
        tenant_locked: bool = False,
    ) -> list[HandedOff]:
        """Admit the tenant's first queued items, as many as places are free (at most `cap`), in the transaction of
        the change that freed a place: a queued item then needs no second admission, only to be told.

        Each handed item's state change is written at its own current mark (the rank of its last admission, which
        it accepted): nothing it scheduled is outranked, and anything it schedules next ranks higher. The tenant
        row is locked as admission locks it, so the two cannot both take one place.

        A queued item among the first ones whose row is locked right now is admitting itself: it waits for the
        tenant lock this transaction holds, then counts. It keeps its place (the hand-off goes to the others among
        the first, no further), so it finds that place free. Stopping at it instead lost a wakeup: the items behind
        it that had already asked, and been queued, waited for their fallback timer with places free.
        (`tenant_locked`: the caller holds the tenant lock already.)"""
        conn = await s.connection()
        if not tenant_locked:
            await conn.execute(sql.TENANT_LOCK, {"tenant": tenant_id})
        # The first queued items, each row with the tenant's in-flight count: one statement, and none at all to
        # count when nothing is queued.
        head = (
            await conn.execute(sql.FIRST_QUEUED, {"tenant": tenant_id, "states": list(IN_FLIGHT_STATES), "n": cap})
        ).all()
        if not head:
            return []
        # The first `free` queued items are owed a place: the ones locked take theirs themselves, the others are
        # handed theirs here (at most `cap`). A locked item does not use up the cap: when the first `cap` were all
        # locked and more places are free, the hand-off goes on down the queue (stopping at the first `cap` lost
        # the wakeup of an item behind them: queued, with a place free).
        free = max_in_flight - int(head[0][1] or 0)
        handed: list[HandedOff] = []
        owed, asked = 0, cap
        while free > owed and head:
            first = [r[0] for r in head[: free - owed]]
            owed += len(first)
            locked = {r[0]: (int(r[1]), str(r[2])) for r in (await conn.execute(sql.LOCK_QUEUED, {"ids": first})).all()}
            for wid in first:
                if wid not in locked:
                    continue  # admitting itself, into the place left for it
                mark, workflow_id = locked[wid]
                rank = Rank.decode(mark)
                handed_write = FencedWrite(wid, tenant_id, rank, f"hand_off from {from_item}")
                await self.change_state(
                    s,
                    Accepted(now=w.now, rank=rank),
                    StateChange(handed_write, WorkItemState.admitted, "admitted: a place freed"),
                )
                handed.append(HandedOff(work_item_id=wid, workflow_id=workflow_id))
                if len(handed) >= cap:
                    return handed
            if len(head) < asked or free <= owed:
                break  # the queue ends here, or every place is owed
            last = head[len(first) - 1]
            asked = min(cap, free - owed)
            head = (
                await conn.execute(
                    sql.NEXT_QUEUED,
                    {
                        "tenant": tenant_id,
                        "after_created_at": last[-1],
                        "after_id": last[0],
                        "n": asked,
                    },
                )
            ).all()
        return handed

    async def admit(
        self,
        write: FencedWrite,
        max_in_flight: int | None,
        fingerprints: Callable[[AsyncSession, str], Awaitable[list[str | None]]],
    ) -> WriteResult[Admission]:
        """Admission in one transaction: `submitted`/`queued` -> `admitted` if the tenant has fewer than
        `max_in_flight` items in flight counting every queued item submitted before this one (first come, first
        served), else -> `queued`. An item already further on (a continued run, or one a freed place was handed
        to) stays as it is. The value carries the item's failure fingerprints so far (`fingerprints`), for the
        breaker. Rejected with `missing` when the item is not in the store, `closed` when it is already terminal."""
        work_item_id, tenant_id = write.work_item_id, write.tenant_id

        async def _apply(s: AsyncSession, w: Accepted) -> Admission:
            conn = await s.connection()
            state = w.state
            waiting = state in (WorkItemState.submitted.value, WorkItemState.queued.value)
            if not waiting:
                return Admission(admitted=True, fingerprints=await fingerprints(s, work_item_id))
            in_flight = ahead = 0
            if max_in_flight is not None:
                # Serialise the tenant's admissions so two of them cannot both take the last free place. The counts
                # are a statement of their own, so that they see everything committed before the lock was granted.
                await conn.execute(sql.TENANT_LOCK, {"tenant": tenant_id})
                counts = (
                    await conn.execute(
                        sql.ADMISSION_COUNTS,
                        {
                            "tenant": tenant_id,
                            "states": list(IN_FLIGHT_STATES),
                            "created_at": w.created_at,
                            "wid": work_item_id,
                        },
                    )
                ).one()
                in_flight, ahead = int(counts[0] or 0), int(counts[1] or 0)
            if max_in_flight is not None and in_flight + ahead >= max_in_flight:
                reason = f"queued: {in_flight} of the tenant's {max_in_flight} in-flight places taken, {ahead} ahead"
                if state != WorkItemState.queued.value:
                    await self.change_state(s, w, StateChange(write, WorkItemState.queued, reason))
                return Admission(admitted=False, queued_position=ahead + 1, in_flight=in_flight)
            await self.change_state(s, w, StateChange(write, WorkItemState.admitted, "admitted"))
            # A fresh item has no attempts yet; a continued run is not waiting (above).
            return Admission(admitted=True, in_flight=in_flight + 1, fingerprints=[])

        return await self.fenced_write(write, _apply)

    async def change_state(self, s: AsyncSession, w: Accepted, change: StateChange) -> None:
        """The state change of an accepted fenced write (at `w.rank`): the row (with its raised fencing mark), its
        `state_changed` event and the webhook outbox rows, in the caller's transaction. With `change.attempt`, the
        item's attempt count is raised to its number by the same update."""
        work_item_id, tenant_id = change.write.work_item_id, change.write.tenant_id
        rank = w.rank.encode()
        values: dict[str, Any] = {
            "state": change.state.value,
            "updated_at": w.now,
            "state_rank": rank,
            "fence_rank": rank,
        }
        if change.reason is not None:
            values["reason"] = change.reason
        if change.fields:
            values.update(change.fields)
            if "result" in change.fields:
                values["result_rank"] = rank
        if change.attempt is not None:
            # A value computed by the database (a task's attempt count): the statement is built for this call.
            values["attempt_count"] = self.attempt_count_at_least(change.attempt.number)
        if any(isinstance(v, ClauseElement) for v in values.values()):
            stmt = self.with_event(
                update(WorkItem).where(WorkItem.id == work_item_id).values(**values).returning(sql.HAS_WEBHOOKS)
            )
            params: dict[str, Any] = {"hooks_tenant": tenant_id}
        else:
            stmt = self._state_update(tuple(sorted(values)))
            params = {"wid": work_item_id, "hooks_tenant": tenant_id, **{f"v_{k}": v for k, v in values.items()}}
        hooks = (
            await self.execute_with_event(
                s,
                stmt,
                params,
                {
                    "work_item_id": work_item_id,
                    "tenant_id": tenant_id,
                    "type": "state_changed",
                    "data": change.event(),
                    "rank": rank,
                    "created_at": w.now,
                },
                ready=True,
            )
        ).scalar_one()
        w.mark_raised = True
        if not hooks:
            return
        # Webhooks outbox: notifications commit atomically with the change they announce.
        await enqueue_webhooks(
            s,
            tenant_id=tenant_id,
            work_item_id=work_item_id,
            event_type="work_item.state_changed",
            payload=change.webhook_payload(occurred_at=w.now),
            now=w.now,
        )

    async def write_attempt(
        self, s: AsyncSession, w: Accepted, write: FencedWrite, r: AttemptRecord, *, count: bool = True
    ) -> None:
        """The attempt row, the item's attempt count and an `attempt_recorded` event, in an accepted write (the
        reference; `attempt_op` in server_side.py is the same for `crewwork_fenced_write`). With `count=False` the
        caller raises the count in its own update of the item's row (`change_state`): one statement fewer for a write
        that changes the row anyway."""
        conn = await s.connection()
        rank = w.rank.encode()
        work_item_id = write.work_item_id
        row = {"rank": rank, **r.columns(), "updated_at": w.now}
        ins = self.insert(Attempt).values(work_item_id=work_item_id, number=r.number, created_at=w.now, **row)
        # The row and its event: one statement on PostgreSQL.
        await self.execute_with_event(
            s,
            ins.on_conflict_do_update(index_elements=[Attempt.work_item_id, Attempt.number], set_=row),
            {},
            {
                "work_item_id": work_item_id,
                "tenant_id": write.tenant_id,
                "type": "attempt_recorded",
                "data": r.event_data(),
                "rank": rank,
                "created_at": w.now,
            },
        )
        if count:
            await conn.execute(
                update(WorkItem)
                .where(WorkItem.id == work_item_id)
                .values(attempt_count=self.attempt_count_at_least(r.number), updated_at=w.now)
            )

    async def record_attempt(self, write: FencedWrite, record: AttemptRecord) -> WriteResult[list[str | None]]:
        """Insert or replace attempt `record.number`'s record. The accepted write's value is the item's failure
        fingerprints in attempt order (None for a passed attempt), read in the same transaction: what the workflow's
        same-cause breaker needs."""

        async def _apply(s: AsyncSession, w: Accepted) -> list[str | None]:
            await self.write_attempt(s, w, write, record)
            return await self.fingerprints_in(s, write.work_item_id)

        return await self.fenced_write(write, _apply)

    async def fingerprints_in(self, s: AsyncSession, work_item_id: str) -> list[str | None]:
        """The item's failure fingerprints in attempt order, None for a passed attempt."""
        conn = await s.connection()
        rows = await conn.execute(
            select(Attempt.verdict, Attempt.fingerprint)
            .where(Attempt.work_item_id == work_item_id)
            .order_by(Attempt.number)
        )
        return [fp if verdict != "passed" else None for verdict, fp in rows.all()]
