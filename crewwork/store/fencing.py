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

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy import LargeBinary, Select, Table, bindparam, func, insert, select, text, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import ClauseElement

from crewwork import tracing
from crewwork.masking import mask_secrets, without_nul
from crewwork.models import WorkItemState
from crewwork.store.artifacts import insert_artifacts
from crewwork.store.engine import Database, StoreError
from crewwork.store.tables import Artifact, Attempt, Event, Tenant, Webhook, WorkItem

T = TypeVar("T")
U = TypeVar("U")

_EVENT_INSERT = insert(Event)
# PostgreSQL: an event appended by the statement it goes with, as a data-modifying CTE (`WITH ev AS (INSERT INTO
# events ...) UPDATE work_items ...`): the change and its event in one round trip. A round trip to the database cost
# the worker ~0.3 ms of CPU (the socket write alone ~0.14 ms; bench/overhead.py under py-spy), and every state
# change, attempt record and evidence event had its own. Both statements of one SQL statement see the same snapshot
# and commit in the same transaction; nothing reads the event back. SQLite has no DML in a CTE and runs the two
# statements (in process: no round trip to save).
_EVENT_CTE = (
    insert(Event)
    .values(
        work_item_id=bindparam("ev_work_item_id"),
        tenant_id=bindparam("ev_tenant_id"),
        type=bindparam("ev_type"),
        data=bindparam("ev_data", type_=Event.__table__.c.data.type),
        rank=bindparam("ev_rank"),
        created_at=bindparam("ev_created_at"),
    )
    .cte("ev")
)

# Statements of the hot path, built once: building a statement and its cache key was a tenth of a worker's CPU per
# item (bench/trace.py --profile). Values are bound per call.
# Whether the changed item's tenant has an active webhook: returned by the state change's own UPDATE, whose snapshot
# is taken after every lock the write waited for (the row's, the tenant's), so a webhook registered before the change
# commits is seen, as the outbox insert's own lookup saw it. (Read in the write's first statement it predated those
# waits, and a change that committed after a webhook's registration was never announced.)
# (The tenant is a bound value, not a correlation: SQLite's RETURNING clause is rendered with unqualified column
# names, and `tenant_id = tenant_id` inside the subquery would match every tenant's webhooks.)
_HAS_WEBHOOKS = (
    select(Webhook.id)
    .where(Webhook.tenant_id == bindparam("hooks_tenant"), Webhook.active.is_(True))
    .exists()
    .label("hooks")
)
_IN_FLIGHT_COUNT = (
    select(func.count())
    .select_from(WorkItem)
    .where(WorkItem.tenant_id == bindparam("tenant"), WorkItem.state.in_(bindparam("states", expanding=True)))
    .scalar_subquery()
)
_QUEUED_AHEAD_COUNT = (
    select(func.count())
    .select_from(WorkItem)
    .where(
        WorkItem.tenant_id == bindparam("tenant"),
        WorkItem.state == "queued",
        # Row values: both databases seek the (tenant, state, created_at, id) index.
        tuple_(WorkItem.created_at, WorkItem.id) < tuple_(bindparam("created_at"), bindparam("wid")),
    )
    .scalar_subquery()
)
_ADMISSION_COUNTS = select(_IN_FLIGHT_COUNT.label("in_flight"), _QUEUED_AHEAD_COUNT.label("ahead"))
# FOR NO KEY UPDATE: it serialises admissions and hand-offs, but not against the KEY SHARE locks that the foreign key
# checks of rows referencing the tenant take on its row (a submission's work item, a webhook, a repository, an API
# key; `events` has no foreign key). With FOR UPDATE, two items ending at once deadlocked (found under load; the
# lock that closed the cycle was not pinned down further).
_TENANT_LOCK = select(Tenant.id).where(Tenant.id == bindparam("tenant")).with_for_update(key_share=True)
_FIRST_QUEUED = (
    select(WorkItem.id, _IN_FLIGHT_COUNT.label("in_flight"), WorkItem.created_at)
    .where(WorkItem.tenant_id == bindparam("tenant"), WorkItem.state == "queued")
    .order_by(WorkItem.created_at, WorkItem.id)
    .limit(bindparam("n"))
)
# The queued items after a given one, in queue order (when the first ones were all admitting themselves).
_NEXT_QUEUED = (
    select(WorkItem.id, WorkItem.created_at)
    .where(
        WorkItem.tenant_id == bindparam("tenant"),
        WorkItem.state == "queued",
        tuple_(WorkItem.created_at, WorkItem.id) > tuple_(bindparam("after_created_at"), bindparam("after_id")),
    )
    .order_by(WorkItem.created_at, WorkItem.id)
    .limit(bindparam("n"))
)
_LOCK_QUEUED = (
    select(WorkItem.id, WorkItem.fence_rank, WorkItem.workflow_id)
    .where(WorkItem.id.in_(bindparam("ids", expanding=True)), WorkItem.state == "queued")
    .with_for_update(skip_locked=True)
)
_RAISE_MARK = update(WorkItem).where(WorkItem.id == bindparam("wid")).values(fence_rank=bindparam("rank"))

# PostgreSQL: a whole fenced write in one call of `crewwork_fenced_write` (migration 0008), outside an explicit
# transaction: one round trip where the Python path makes 4 to 9 (BEGIN, the row's lock, each change, COMMIT), each
# ~0.3 ms of a worker's CPU. The function runs the Python path's statements in the same order, each with its own
# snapshot; the Python path (SQLite, and `CREWWORK_STORE_SERVER_WRITES=false`) stays the reference.
_SERVER_WRITE = text(
    "SELECT crewwork_fenced_write(:wid, :tenant, :rank, :writer, CAST(:ops AS jsonb), :terminal, :in_flight, "
    "CAST(:hand_off AS jsonb), :trace, :art_id, :art_name, :art_type, :art_size, :art_sha, :art)"
).bindparams(bindparam("art", type_=LargeBinary))
# The columns a server-side state change sets from `fields` (crewwork_change_state); a write with any other runs the
# Python path.
_SERVER_FIELDS = frozenset({"result", "delivery_branch", "landed_commit", "mock"})
_TERMINAL_STATES = [s.value for s in WorkItemState if s.terminal]


def _json_text(value: Any) -> str:
    """A JSON value of a server-side write's operation, as the text the Python path's `json` columns store (what
    SQLAlchemy's JSON type binds: `json.dumps`). Passed inside `p_ops` as a string and cast to `json` there, it is
    stored as that text: `jsonb` would have rewritten it (its keys sorted, 1e16 made the integer 10000000000000000,
    1e300 an integer that is not 1e300, -0.0 made 0.0) and refused a lone surrogate."""
    return json.dumps(value)


_NO_ARTIFACT: dict[str, Any] = {
    "art_id": None,
    "art_name": None,
    "art_type": None,
    "art_size": None,
    "art_sha": None,
    "art": None,
}

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

    def carrying(self, value: U | None) -> WriteResult[U]:
        """The same outcome with another value (a server-side write's results, decoded)."""
        return WriteResult(
            ok=self.ok, value=value, current=self.current, closed=self.closed, missing=self.missing, state=self.state
        )


@dataclass
class Accepted:
    """What an accepted write's `apply` gets: the database clock and the rank it writes with."""

    now: float
    rank: Rank
    mark_raised: bool = field(default=False)
    """Set once the item row's `fence_rank` has been raised to `rank` in this transaction (by `change_state`)."""
    state: str = ""
    """The item's state when its row was locked (before this write)."""
    created_at: float = 0.0
    """When the item was submitted (its place in its tenant's queue)."""


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

    def clean(self) -> AttemptRecord:
        """This record with no NUL nor lone surrogate in any string (`without_nul`)."""
        return AttemptRecord(
            number=self.number,
            verdict=without_nul(self.verdict),
            reason=without_nul(self.reason),
            cause=without_nul(self.cause),
            fingerprint=without_nul(self.fingerprint),
            agent=without_nul(self.agent),
            validation=without_nul(self.validation),
        )

    def event_data(self) -> dict[str, Any]:
        """The `attempt_recorded` event's data."""
        diff_ref = ((self.agent or {}).get("diff_ref") or {}).get("id")
        return {
            "number": self.number,
            "verdict": self.verdict,
            "reason": self.reason,
            "cause": self.cause,
            "diff_ref": diff_ref,
        }

    def server_op(self, *, count: bool) -> dict[str, Any]:
        """The record as an 'attempt' operation of `crewwork_fenced_write`."""
        return {
            "op": "attempt",
            "number": self.number,
            "verdict": self.verdict,
            "reason": self.reason,
            "cause": self.cause,
            "fingerprint": self.fingerprint,
            # None is bound to the json column as the JSON value null on the Python path (`write_attempt`): alike.
            "agent": _json_text(mask_secrets(self.agent) if self.agent else None),
            "validation": _json_text(mask_secrets(self.validation) if self.validation else None),
            "event": _json_text(self.event_data()),
            "count": count,
        }


@dataclass(frozen=True)
class Admission:
    admitted: bool
    queued_position: int | None = None
    """1-based place among the tenant's queued items when not admitted (the in-flight limit is reached)."""
    in_flight: int = 0
    fingerprints: list[str | None] = field(default_factory=list)


@dataclass(frozen=True)
class HandedOff:
    """A queued item admitted by the transaction of the item whose place it took (`FencingStore.hand_off`)."""

    work_item_id: str
    workflow_id: str


class FencingStore(Database):
    _fence_select: Select[Any] | None = None

    def _fence_statement(self) -> Select[Any]:
        """The fenced write's first statement: lock the item row, read its state, mark and submission time and the
        database clock, in one round trip."""
        if self._fence_select is None:
            self._fence_select = (
                select(WorkItem.state, WorkItem.fence_rank, self.now_sql(), WorkItem.created_at)
                .where(WorkItem.id == bindparam("wid"))
                .with_for_update(of=WorkItem)
            )
        return self._fence_select

    async def insert_event(self, s: AsyncSession, **values: Any) -> None:
        """Append an event inside the caller's transaction with a Core INSERT (the ORM's unit of work cost ~0.3 ms
        of CPU per flush on this hot path)."""
        conn = await s.connection()
        await conn.execute(_EVENT_INSERT, values)

    def with_event(self, stmt: Any) -> Any:
        """`stmt` with `_EVENT_CTE` added on PostgreSQL, unchanged on SQLite: for `execute_with_event(...,
        ready=True)`, built once and kept, so that its cache key is computed once too."""
        return stmt if self.is_sqlite else stmt.add_cte(_EVENT_CTE)

    async def execute_with_event(
        self, s: AsyncSession, stmt: Any, params: dict[str, Any], event: dict[str, Any], *, ready: bool = False
    ) -> Any:
        """Execute `stmt` (an INSERT or UPDATE, with `params`) and append `event` (the columns of an `events` row),
        in the caller's transaction: one statement on PostgreSQL (`_EVENT_CTE`), two on SQLite. `ready`: `stmt` came
        from `with_event` already. Returns the statement's (buffered) result."""
        conn = await s.connection()
        if self.is_sqlite:
            result = await conn.execute(stmt, params)
            await conn.execute(_EVENT_INSERT, event)
            return result
        if not ready:
            stmt = stmt.add_cte(_EVENT_CTE)
        return await conn.execute(stmt, {**params, **{f"ev_{k}": v for k, v in event.items()}})

    def _state_update(self, keys: tuple[str, ...]) -> Any:
        """The state change's UPDATE (with its event on PostgreSQL) for these columns, every value a bound parameter
        `v_<column>`: built once per set of columns. Built per call, its construction and cache key were about a
        tenth of a millisecond of CPU per change."""
        cache = self.__dict__.setdefault("_state_updates", {})
        stmt = cache.get(keys)
        if stmt is None:
            t: Table = WorkItem.__table__  # type: ignore[assignment]
            stmt = self.with_event(
                update(t)
                .where(t.c.id == bindparam("wid"))
                .values({k: bindparam(f"v_{k}", type_=t.c[k].type) for k in keys})
                .returning(_HAS_WEBHOOKS)
            )
            cache[keys] = stmt
        return stmt

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
            row = (await conn.execute(self._fence_statement(), {"wid": work_item_id})).first()
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
            accepted = Accepted(now=now, rank=rank, state=state, created_at=float(row[3]))
            value = await apply(s, accepted)
            if presented > mark and not accepted.mark_raised:
                await conn.execute(_RAISE_MARK, {"wid": work_item_id, "rank": presented})
            return WriteResult(ok=True, value=value, current=current, state=state)

        return await self.transaction(body)

    async def _server_write(
        self,
        *,
        rank: Rank,
        work_item_id: str,
        tenant_id: str,
        writer: str,
        ops: list[dict[str, Any]],
        hand_off: dict[str, int] | None = None,
        artifact: dict[str, Any] | None = None,
    ) -> WriteResult[dict[str, Any]]:
        """`fenced_write` with its operations (`ops`, see migration 0008) run by `crewwork_fenced_write` in one
        round trip. The accepted write's value holds what the operations yield ('fingerprints', 'admission',
        'handed')."""
        params: dict[str, Any] = {
            "wid": work_item_id,
            "tenant": tenant_id,
            "rank": rank.encode(),
            "writer": writer,
            "ops": json.dumps(ops),
            "terminal": _TERMINAL_STATES,
            "in_flight": list(IN_FLIGHT_STATES),
            "hand_off": json.dumps(hand_off) if hand_off is not None else None,
            "trace": tracing.current_traceparent(),
            **_NO_ARTIFACT,
        }
        if artifact is not None:
            params.update(
                art_id=artifact["id"],
                art_name=artifact["name"],
                art_type=artifact["content_type"],
                art_size=artifact["size"],
                art_sha=artifact["sha256"],
                art=artifact["content"],
            )
        try:
            raw = await self.autocommit_scalar(_SERVER_WRITE, params)
        except ProgrammingError as exc:
            if "crewwork_fenced_write" in str(exc) and "does not exist" in str(exc):
                raise StoreError(
                    "the database schema is older than this release: run `crewwork db upgrade` (migration 0008 adds "
                    "the function crewwork_fenced_write), or set CREWWORK_STORE_SERVER_WRITES=false"
                ) from exc
            raise
        out = json.loads(raw) if isinstance(raw, str) else raw
        if out.get("missing"):
            return WriteResult(ok=False, missing=True)
        current = Rank.decode(int(out["mark"]))
        if not out["ok"]:
            return WriteResult(ok=False, current=current, closed=bool(out.get("closed")), state=out["state"])
        return WriteResult(ok=True, value=out["results"], current=current, state=out["state"])

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
        data = without_nul(data)
        if self.server_writes and len(artifacts) <= 1:
            ops: list[dict[str, Any]] = [{"op": "artifact"}] if artifacts else []
            ops.append({"op": "event", "type": type_, "data": _json_text(mask_secrets({**data, "writer": writer}))})
            res = await self._server_write(
                rank=rank,
                work_item_id=work_item_id,
                tenant_id=tenant_id,
                writer=writer,
                ops=ops,
                artifact=artifacts[0] if artifacts else None,
            )
            return res.carrying(None)

        async def _apply(s: AsyncSession, w: Accepted) -> None:
            event = {
                "work_item_id": work_item_id,
                "tenant_id": tenant_id,
                "type": type_,
                "data": mask_secrets({**data, "writer": writer}),
                "rank": w.rank.encode(),
                "created_at": w.now,
            }
            if len(artifacts) == 1:
                # An attempt's transcript: the artifact and its event in one statement.
                row = {**artifacts[0], "created_at": w.now}
                await self.execute_with_event(s, insert(Artifact).values(**row), {}, event)
                return
            await insert_artifacts(s, artifacts, w.now)
            await self.insert_event(s, **event)

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
        max_in_flight: int | None = None,
        hand_off_cap: int = 0,
        attempt: AttemptRecord | None = None,
    ) -> WriteResult[list[HandedOff]]:
        """A fenced state change. `attempt` is written first in the same write (a `task` item's last attempt
        record with its result: one write), with the item's attempt count raised to it by the change itself. When the
        change takes the item out of the in-flight states, its place goes to the tenant's first queued items in the
        same transaction (`hand_off`, at most `hand_off_cap` of them); the value lists them, for the caller to tell
        their workflows. A queued item that ends (cancelled) hands on the free places too: a hand-off that found its
        row locked left it one."""
        handing = max_in_flight is not None and hand_off_cap > 0 and state.value not in IN_FLIGHT_STATES
        reason, fields, event_data = without_nul(reason), without_nul(fields), without_nul(event_data)
        attempt = attempt.clean() if attempt is not None else None
        if self.server_writes and not (set(fields or ()) - _SERVER_FIELDS):
            ops: list[dict[str, Any]] = [attempt.server_op(count=False)] if attempt is not None else []
            server_fields: dict[str, Any] = dict(fields or {})
            if "result" in server_fields:
                server_fields["result"] = _json_text(server_fields["result"])
            if attempt is not None:
                server_fields["attempt_count_at_least"] = attempt.number
            ops.append(
                {
                    "op": "state",
                    "state": state.value,
                    "reason": reason,
                    "fields": server_fields,
                    "event": _json_text(
                        mask_secrets(
                            {"state": state.value, "reason": reason or "", "writer": writer, **(event_data or {})}
                        )
                    ),
                    "payload": mask_secrets(
                        {
                            "work_item_id": work_item_id,
                            "state": state.value,
                            "reason": reason or "",
                            **_delivery(fields),
                        }
                    ),
                }
            )
            res = await self._server_write(
                rank=rank,
                work_item_id=work_item_id,
                tenant_id=tenant_id,
                writer=writer,
                ops=ops,
                hand_off={"max": max_in_flight, "cap": hand_off_cap} if handing and max_in_flight is not None else None,
            )
            handed = [HandedOff(**h) for h in (res.value or {}).get("handed", [])] if res.ok else None
            return res.carrying(handed)
        record = attempt
        if record is not None:
            fields = {**(fields or {}), "attempt_count": self.attempt_count_at_least(record.number)}

        async def _apply(s: AsyncSession, w: Accepted) -> list[HandedOff]:
            if record is not None:
                await self.write_attempt(s, w, work_item_id, tenant_id, record, count=False)
            await self.change_state(s, w, work_item_id, tenant_id, state, reason, writer, fields, event_data)
            return []

        async def _apply_and_hand_off(s: AsyncSession, w: Accepted) -> list[HandedOff]:
            if (
                max_in_flight is None
                or not handing
                # Only an item that held a place hands it on, or a queued one leaving the queue: a hand-off that
                # found its row locked (this write) left it a place, which now goes to the next in line.
                or (w.state not in IN_FLIGHT_STATES and w.state != WorkItemState.queued.value)
            ):
                await _apply(s, w)
                return []
            # The tenant lock first: a wait for it comes before the item's own change, so that change (and its
            # webhook lookup) is not followed by a wait of unbounded length before the commit.
            conn = await s.connection()
            await conn.execute(_TENANT_LOCK, {"tenant": tenant_id})
            await _apply(s, w)
            return await self.hand_off(s, w, tenant_id, work_item_id, max_in_flight, hand_off_cap, tenant_locked=True)

        return await self.fenced_write(
            rank=rank, work_item_id=work_item_id, tenant_id=tenant_id, writer=writer, apply=_apply_and_hand_off
        )

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
            await conn.execute(_TENANT_LOCK, {"tenant": tenant_id})
        # The first queued items, each row with the tenant's in-flight count: one statement, and none at all to
        # count when nothing is queued.
        head = (
            await conn.execute(_FIRST_QUEUED, {"tenant": tenant_id, "states": list(IN_FLIGHT_STATES), "n": cap})
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
            locked = {r[0]: (int(r[1]), str(r[2])) for r in (await conn.execute(_LOCK_QUEUED, {"ids": first})).all()}
            for wid in first:
                if wid not in locked:
                    continue  # admitting itself, into the place left for it
                mark, workflow_id = locked[wid]
                acc = Accepted(now=w.now, rank=Rank.decode(mark))
                await self.change_state(
                    s,
                    acc,
                    wid,
                    tenant_id,
                    WorkItemState.admitted,
                    "admitted: a place freed",
                    f"hand_off from {from_item}",
                    None,
                    None,
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
                    _NEXT_QUEUED,
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
        served), else -> `queued`. An item already further on (a continued run, or one a freed place was handed
        to) stays as it is. The value carries the item's failure fingerprints so far (`fingerprints`), for the
        breaker. Rejected with `missing` when the item is not in the store, `closed` when it is already terminal."""
        if self.server_writes:
            res = await self._server_write(
                rank=rank,
                work_item_id=work_item_id,
                tenant_id=tenant_id,
                writer=writer,
                # The writer as the state change's event names it (masked, as change_state masks that event).
                ops=[{"op": "admit", "max": max_in_flight, "writer": mask_secrets(writer)}],
            )
            adm = (res.value or {}).get("admission")
            return res.carrying(
                None
                if adm is None
                else Admission(
                    admitted=bool(adm["admitted"]),
                    queued_position=adm.get("queued_position"),
                    in_flight=int(adm.get("in_flight") or 0),
                    fingerprints=list(adm.get("fingerprints") or []),
                )
            )

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
                await conn.execute(_TENANT_LOCK, {"tenant": tenant_id})
                counts = (
                    await conn.execute(
                        _ADMISSION_COUNTS,
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
                    await self.change_state(
                        s, w, work_item_id, tenant_id, WorkItemState.queued, reason, writer, None, None
                    )
                return Admission(admitted=False, queued_position=ahead + 1, in_flight=in_flight)
            await self.change_state(
                s, w, work_item_id, tenant_id, WorkItemState.admitted, "admitted", writer, None, None
            )
            # A fresh item has no attempts yet; a continued run is not waiting (above).
            return Admission(admitted=True, in_flight=in_flight + 1, fingerprints=[])

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
        if any(isinstance(v, ClauseElement) for v in values.values()):
            # A value computed by the database (a task's attempt count): built for this call.
            stmt = self.with_event(
                update(WorkItem).where(WorkItem.id == work_item_id).values(**values).returning(_HAS_WEBHOOKS)
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
                    "data": mask_secrets(
                        {"state": state.value, "reason": reason or "", "writer": writer, **(event_data or {})}
                    ),
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

    def attempt_count_at_least(self, number: int) -> Any:
        """The work item's `attempt_count` raised to `number` (a value for an UPDATE of the item's row)."""
        greatest = func.max if self.is_sqlite else func.greatest
        return greatest(WorkItem.attempt_count, number)

    async def write_attempt(
        self,
        s: AsyncSession,
        w: Accepted,
        work_item_id: str,
        tenant_id: str,
        r: AttemptRecord,
        *,
        count: bool = True,
    ) -> None:
        """The attempt row, the item's attempt count and an `attempt_recorded` event, in an accepted write (the
        Python path; `AttemptRecord.server_op` is the same for `crewwork_fenced_write`). With `count=False` the
        caller raises the count in its own update of the item's row (`attempt_count_at_least`): one statement fewer
        for a write that changes the row anyway."""
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
        # The row and its event: one statement on PostgreSQL.
        await self.execute_with_event(
            s,
            ins.on_conflict_do_update(index_elements=[Attempt.work_item_id, Attempt.number], set_=row),
            {},
            {
                "work_item_id": work_item_id,
                "tenant_id": tenant_id,
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
