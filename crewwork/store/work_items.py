"""Work items: the submitted row (inserted by the API at rank 0, before its workflow starts) and its reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from asyncpg.exceptions import UndefinedFunctionError, UniqueViolationError  # type: ignore[import-untyped]
from sqlalchemy import JSON, Float, Table, bindparam, cast, func, insert, literal_column, or_, select, text, tuple_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import IntegrityError, ProgrammingError

from crewwork.boundary.masking import mask_secrets
from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.models.ids import new_id
from crewwork.observability import tracing
from crewwork.store.engine import Database, StoreError, older_schema
from crewwork.store.fencing import IN_FLIGHT_STATES, SUBMISSION, Rank
from crewwork.store.fencing.vocabulary import TERMINAL_STATES
from crewwork.store.tables import Event, WorkItem
from crewwork.store.views import StoredWorkItem, first_view, select_view, view_of, views_of


@dataclass(frozen=True, slots=True)
class StartRow:
    """The columns a workflow start needs (crewwork/admission/starts.py)."""

    id: str
    tenant_id: str
    workflow_id: str
    spec: dict[str, Any]
    repo_url: str | None
    base_commit: str | None
    mock: bool
    state: str


class IdempotencyConflict(StoreError):
    """The tenant already submitted another payload with this idempotency key."""

    def __init__(self, existing: StoredWorkItem) -> None:
        super().__init__(
            f"idempotency key already used for work item {existing.id} with a different submission; "
            "use a new key for a new submission"
        )
        self.existing = existing


class QueueFull(StoreError):
    """The tenant already has its limit of items waiting for a place: nothing was stored."""

    def __init__(self, max_waiting: int) -> None:
        super().__init__(
            f"the tenant already has {max_waiting} or more work items waiting for a place (CREWWORK_TENANT_MAX_QUEUED); "
            "submit again once some of them have started"
        )
        self.max_waiting = max_waiting


# A work item waits for a place in these states: `submitted` (stored, not yet admitted) and `queued`.
WAITING_STATES = (WorkItemState.submitted.value, WorkItemState.queued.value)


def _replay(found: StoredWorkItem, submission_hash: str | None) -> StoredWorkItem:
    """The earlier item for a repeated key, if the submission is the same (rows from before migration 0007 have no
    hash and are taken as the same)."""
    if found.submission_hash and submission_hash and found.submission_hash != submission_hash:
        raise IdempotencyConflict(found)
    return found


# How many of a tenant's items wait for a place, counted up to `cap`: with fresh statistics PostgreSQL walks the
# (tenant, state, created_at, id) index and stops there, however long the queue (a tenant with 300,000 past items and
# 1,000 queued: 0.6 ms). Index entries of row versions not yet vacuumed are read too, as by the admission's counts.
_WAITING = select(func.count()).select_from(
    select(WorkItem.id)
    .where(WorkItem.tenant_id == bindparam("tenant"), WorkItem.state.in_(WAITING_STATES))
    .limit(bindparam("cap"))
    .subquery()
)


# crewwork_submit (migration 0016), as the driver's statement and as SQLAlchemy's.
_SUBMIT_DRIVER = "SELECT crewwork_submit(" + ", ".join(f"${i}" for i in range(1, 19)) + ")"
_SUBMIT = text("SELECT crewwork_submit(" + ", ".join(f":a{i}" for i in range(18)) + ")")
ADMISSION_RANK = Rank(0, 1).encode()
"""crewwork.admission.starts.ADMISSION, the rank `crewwork_submit` admits at (a test checks the two agree)."""


def _admission_reason(admission: dict[str, Any], max_in_flight: int) -> str:
    """The reason `crewwork_fenced_write`'s admission stores (its `why`), for the row returned."""
    if admission["admitted"]:
        return "admitted"
    in_flight = int(admission.get("in_flight") or 0)
    ahead = int(admission.get("queued_position") or 1) - 1
    return f"queued: {in_flight} of the tenant's {max_in_flight} in-flight places taken, {ahead} ahead"


class WorkItemStore(Database):
    async def create_work_item(
        self,
        *,
        tenant_id: str,
        spec: WorkItemSpec,
        base_commit: str | None,
        repo_path: str | None,
        submission_hash: str | None = None,
        mock: bool = False,
        max_waiting: int | None = None,
        admit_max_in_flight: int | None = None,
    ) -> tuple[StoredWorkItem, bool]:
        """Insert a work item, or return the existing one for the same (tenant, idempotency key) if its
        `submission_hash` is the same (else `IdempotencyConflict`).

        `admit_max_in_flight`: on PostgreSQL with server-side writes, admit the new item in the same call
        (`crewwork_submit`, migration 0016: the insert, then the admission's own fenced write at rank ADMISSION under
        this in-flight limit, one round trip and one commit); the row returned is then `admitted` or `queued`.
        Elsewhere (SQLite, `CREWWORK_STORE_SERVER_WRITES=false`) it is ignored and the row is `submitted`: the
        caller admits it (crewwork/admission/starts.py `admit_and_start`).

        `mock`: the item's agent is a mock (labelled so from the start). `max_waiting`: refuse the insert
        (`QueueFull`, nothing stored) when the tenant already has that many items waiting for a place, counted by the
        insert's own statement up to `max_waiting`; submissions racing each other can each see the same count, so the
        queue can pass the limit by at most their number. Returns (the item, created)."""
        if spec.idempotency_key:
            found = await self.work_item_by_idempotency_key(tenant_id, spec.idempotency_key)
            if found is not None:
                return _replay(found, submission_hash), False
        wid = new_id("wi")
        values: dict[str, Any] = {
            "id": wid,
            "tenant_id": tenant_id,
            "kind": spec.kind.value,
            "state": WorkItemState.submitted.value,
            "spec": spec.model_dump(mode="json"),
            "idempotency_key": spec.idempotency_key,
            "submission_hash": submission_hash,
            "labels": dict(spec.labels),
            "repo_url": repo_path,
            "base_commit": base_commit,
            "workflow_id": f"work-item-{wid}",
            "reason": "",
            # No "result": None bound to the JSON column is written as the JSON value `null`, not SQL NULL (the ORM
            # insert left the column out; `result IS NULL` must find a fresh item). The returned row sets it below.
            "result_rank": None,
            "state_rank": None,
            "attempt_count": 0,
            "delivery_branch": None,
            "landed_commit": None,
            "mock": mock,
            "fence_rank": SUBMISSION.encode(),
        }
        event = {
            "work_item_id": wid,
            "tenant_id": tenant_id,
            "type": "submitted",
            "data": mask_secrets({"kind": spec.kind.value, "base_commit": base_commit}),
            "rank": SUBMISSION.encode(),
        }
        try:
            if admit_max_in_flight is not None and not self.is_sqlite and getattr(self, "server_writes", False):
                return await self._submit_admitted(values, event, max_waiting, admit_max_in_flight), True
            if self.is_sqlite:
                async with self.session() as s:
                    conn = await s.connection()
                    if max_waiting is not None:
                        waiting = (await conn.execute(_WAITING, {"tenant": tenant_id, "cap": max_waiting})).scalar_one()
                        if waiting >= max_waiting:
                            raise QueueFull(max_waiting)
                    now = await self.now(s)
                    await conn.execute(insert(WorkItem).values(**values, created_at=now, updated_at=now))
                    await conn.execute(insert(Event).values(**event, created_at=now))
            else:
                # One statement, outside an explicit transaction (a single statement is atomic): the row and its
                # `submitted` event at one reading of the database clock. It was five round trips (BEGIN, the
                # clock, two INSERTs, COMMIT), each ~0.3 ms of the API process's CPU.
                stmt = self._submission_statement(tuple(values), capped=max_waiting is not None)
                params = {**{f"v_{k}": v for k, v in values.items()}, **{f"ev_{k}": v for k, v in event.items()}}
                if max_waiting is not None:
                    params.update(cap=max_waiting, tenant=tenant_id)
                async with self.engine.connect() as c:
                    conn = await c.execution_options(isolation_level="AUTOCOMMIT")
                    stored = (await conn.execute(stmt, params)).scalar_one_or_none()
                if stored is None:  # the statement inserted nothing: the tenant's queue is full
                    raise QueueFull(max_waiting or 0)
                now = float(stored)
            return view_of(StoredWorkItem, {**values, "result": None, "created_at": now, "updated_at": now}), True
        except (IntegrityError, UniqueViolationError, QueueFull):
            # A request with the same key (a client's retry racing its first try) may have stored the item since the
            # lookup above: the duplicate insert, or one refused because that item took the last place, is then that
            # item again, not an error.
            if spec.idempotency_key:
                found = await self.work_item_by_idempotency_key(tenant_id, spec.idempotency_key)
                if found is not None:
                    return _replay(found, submission_hash), False
            raise

    async def _submit_admitted(
        self, values: dict[str, Any], event: dict[str, Any], max_waiting: int | None, max_in_flight: int
    ) -> StoredWorkItem:
        """The row and its event, then its admission, in one call of `crewwork_submit` (migration 0016)."""
        args = (
            values["id"],
            values["tenant_id"],
            values["kind"],
            json.dumps(values["spec"]),  # the text SQLAlchemy's JSON type binds, as the two-statement path stores
            values["idempotency_key"],
            values["submission_hash"],
            json.dumps(values["labels"]),
            values["repo_url"],
            values["base_commit"],
            values["workflow_id"],
            values["mock"],
            json.dumps(event["data"]),
            max_waiting,
            list(WAITING_STATES),
            max_in_flight,
            TERMINAL_STATES,
            list(IN_FLIGHT_STATES),
            tracing.current_traceparent(),
        )
        try:
            if self.driver_writes:
                raw = await self.driver_scalar(_SUBMIT_DRIVER, *args)
            else:
                raw = await self.autocommit_scalar(_SUBMIT, {f"a{i}": v for i, v in enumerate(args)})
        except (ProgrammingError, UndefinedFunctionError) as exc:
            older = older_schema(exc, "crewwork_submit", "0016")
            if older is not None:
                raise older from exc
            raise
        if raw is None:  # the tenant's queue has no room: nothing stored
            raise QueueFull(max_waiting or 0)
        out = json.loads(raw) if isinstance(raw, str) else raw
        created = float(out["created_at"])
        row = {**values, "result": None, "created_at": created, "updated_at": created}
        write = out["write"]
        admission = (write.get("results") or {}).get("admission") if write.get("ok") else None
        if admission is not None:
            row.update(
                state=WorkItemState.admitted.value if admission["admitted"] else WorkItemState.queued.value,
                reason=_admission_reason(admission, max_in_flight),
                fence_rank=ADMISSION_RANK,
                state_rank=ADMISSION_RANK,
                updated_at=float(write["now"]),
            )
        return view_of(StoredWorkItem, row)

    def _submission_statement(self, keys: tuple[str, ...], *, capped: bool = False) -> Any:
        """PostgreSQL: the submitted row and its event in one statement at one reading of the database clock, every
        value a bound parameter (`v_<column>`, `ev_<column>`; `cap` when `capped`): built once (its construction and
        cache key cost more CPU than the round trips it saves when built per call)."""
        return self.built_once(("submission", keys, capped), lambda: self._build_submission_statement(keys, capped))

    def _build_submission_statement(self, keys: tuple[str, ...], capped: bool) -> Any:
        wi: Table = WorkItem.__table__  # type: ignore[assignment]
        ev_t: Table = Event.__table__  # type: ignore[assignment]
        clock = select(literal_column(self.now_sql().text, Float).label("now")).cte("clock")
        ev_keys = ("work_item_id", "tenant_id", "type", "data", "rank")
        if not capped:
            now_sql = select(clock.c.now).scalar_subquery()
            ev = (
                insert(ev_t)
                .values({**{k: bindparam(f"ev_{k}", type_=ev_t.c[k].type) for k in ev_keys}, "created_at": now_sql})
                .cte("submitted_event")
            )
            return (
                insert(wi)
                .values(
                    {
                        **{k: bindparam(f"v_{k}", type_=wi.c[k].type) for k in keys},
                        "created_at": now_sql,
                        "updated_at": now_sql,
                    }
                )
                .returning(wi.c.created_at)
                .add_cte(ev)
            )
        # With the tenant's queue limit: the row is inserted only while fewer than `cap` of the tenant's items wait
        # (the count stops at `cap`), and the event only with the row it goes with. Every part of the
        # statement sees one snapshot.
        room = select(clock.c.now).where(_WAITING.scalar_subquery() < bindparam("cap")).subquery("room")
        row = (
            insert(wi)
            .from_select(
                [*keys, "created_at", "updated_at"],
                select(*[bindparam(f"v_{k}", type_=wi.c[k].type) for k in keys], room.c.now, room.c.now),
            )
            .returning(wi.c.id, wi.c.created_at)
            .cte("submitted_row")
        )
        ev = (
            insert(ev_t)
            .from_select(
                [*ev_keys, "created_at"],
                select(row.c.id, *[bindparam(f"ev_{k}", type_=ev_t.c[k].type) for k in ev_keys[1:]], row.c.created_at),
            )
            .cte("submitted_event")
        )
        return select(row.c.created_at).add_cte(ev)

    async def work_item_by_idempotency_key(self, tenant_id: str, key: str) -> StoredWorkItem | None:
        async with self.session() as s:
            q = select_view(StoredWorkItem, WorkItem).where(
                WorkItem.tenant_id == tenant_id, WorkItem.idempotency_key == key
            )
            return await first_view(StoredWorkItem, s.execute(q))

    async def get_work_item(self, work_item_id: str, tenant_id: str | None = None) -> StoredWorkItem | None:
        async with self.session() as s:
            q = select_view(StoredWorkItem, WorkItem).where(WorkItem.id == work_item_id)
            if tenant_id is not None:
                q = q.where(WorkItem.tenant_id == tenant_id)
            return await first_view(StoredWorkItem, s.execute(q))

    async def start_row(self, work_item_id: str) -> StartRow | None:
        """What starting the item's workflow needs (crewwork/admission/starts.py), in one round trip outside a transaction:
        the hand-off starts the workflow of every queued item it admits, and the full row's read (an ORM session,
        every column made a view) was a third of that start's CPU in the control pool (py-spy, bench/trace.py)."""
        t = WorkItem
        stmt = self.built_once(
            "start_row",
            lambda: select(t.id, t.tenant_id, t.workflow_id, t.spec, t.repo_url, t.base_commit, t.mock, t.state).where(
                t.id == bindparam("wid")
            ),
        )
        if self.is_sqlite:
            async with self.session() as s:
                r = (await s.execute(stmt, {"wid": work_item_id})).first()
        else:
            r = await self.autocommit_first(stmt, {"wid": work_item_id})
        if r is None:
            return None
        return StartRow(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7])

    def _spec_text(self, *path: str) -> Any:
        """A text field of the stored submission (`spec`), as SQL (SQLAlchemy's JSON path: JSON_EXTRACT on SQLite,
        `#>>` on PostgreSQL)."""
        return WorkItem.spec[path].as_string()

    async def list_work_items(
        self,
        tenant_id: str | None,
        *,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        state: str | None = None,
        kind: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        labels: dict[str, str] | None = None,
        search: str | None = None,
        repo: str | None = None,
        agent: str | None = None,
    ) -> list[StoredWorkItem]:
        """Newest first, keyset-paginated on (created_at, id): the items strictly before `before`. `tenant_id`
        None is every tenant's (an admin's listing). `labels` must all match; `search` is an id prefix, text in the
        repository locator or in the instruction; `repo` text in the repository locator; `agent` the agent's name."""
        q = select_view(StoredWorkItem, WorkItem)
        if tenant_id is not None:
            q = q.where(WorkItem.tenant_id == tenant_id)
        if state:
            q = q.where(WorkItem.state == state)
        if kind:
            q = q.where(WorkItem.kind == kind)
        if created_after is not None:
            q = q.where(WorkItem.created_at >= created_after)
        if created_before is not None:
            q = q.where(WorkItem.created_at < created_before)
        if labels:
            if self.is_sqlite:
                for k, v in labels.items():
                    q = q.where(func.json_extract(WorkItem.labels, f'$."{k.replace(chr(34), "")}"') == v)
            else:
                q = q.where(cast(WorkItem.labels, JSONB).op("@>")(cast(cast(labels, JSON), JSONB)))
        if search:
            like = _like(search)
            q = q.where(
                or_(
                    WorkItem.id.like(f"{like}%", escape="\\"),
                    WorkItem.repo_url.like(f"%{like}%", escape="\\"),
                    self._spec_text("instruction").like(f"%{like}%", escape="\\"),
                )
            )
        if repo:
            q = q.where(WorkItem.repo_url.like(f"%{_like(repo)}%", escape="\\"))
        if agent:
            q = q.where(self._spec_text("agent", "name") == agent)
        if before is not None:
            # A row-value comparison, so PostgreSQL seeks the (tenant, created_at, id) index instead of filtering.
            q = q.where(tuple_(WorkItem.created_at, WorkItem.id) < tuple_(*before))
        q = q.order_by(WorkItem.created_at.desc(), WorkItem.id.desc()).limit(limit)
        async with self.session() as s:
            return await views_of(StoredWorkItem, s.execute(q))


def _like(text: str) -> str:
    """`text` for a LIKE pattern with `\\` as the escape character: its wildcards taken literally."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
