"""The canonical store: work items, attempts, events, artifacts, fencing tokens and leases.

Every change of a work item's state or result goes through `fenced_write`: the writer presents the token it was
issued; if the database has issued a newer token for that key since, the write changes nothing, returns stale, and
appends a `stale_write_rejected` event naming both tokens. Tokens come from a counter row in the database and the
check and the write happen in one transaction that holds the counter row's lock (PostgreSQL `SELECT ... FOR UPDATE`,
SQLite `BEGIN IMMEDIATE`), so no token can be issued between the check and the write.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import and_, bindparam, delete, event, func, insert, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from crewwork.models import WorkItemSpec, WorkItemState
from crewwork.store.tables import (
    ApiKey,
    Artifact,
    Attempt,
    Event,
    Fence,
    Lease,
    LeaseHistory,
    Tenant,
    WorkItem,
)

T = TypeVar("T")

API_KEY_PREFIX = "cw_"


class StoreError(RuntimeError):
    pass


class NotFound(StoreError):
    pass


class ArtifactTooLarge(StoreError):
    pass


_EVENT_INSERT = insert(Event)


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


@dataclass
class WriteResult(Generic[T]):
    ok: bool
    """False when the write was rejected because a newer token exists (nothing was changed)."""
    value: T | None = None
    current_token: int | None = None
    closed: bool = False
    """True when the write was rejected because the work item is already terminal."""
    token: int | None = None
    """The token the write presented (the one issued inside the write when the caller asked for a fresh one)."""
    missing: bool = False
    """True when the write was rejected because the work item is not in the store."""
    state: str | None = None
    """The work item's state when the write was checked (before it was applied)."""

    @property
    def stale(self) -> bool:
        return not self.ok


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    key_id: str
    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


_SECRET_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\bcw_[A-Za-z0-9_-]{16,}"),
    re.compile(r"(?i)((?:api[_-]?key|password|secret|token)\"?\s*[:=]\s*\"?)[^\s\",}]{6,}"),
]


def mask_secrets(value: Any) -> Any:
    """Mask secret-looking strings inside an event payload, at write time (events are append-only)."""
    if isinstance(value, str):
        out = value
        for pat in _SECRET_PATTERNS:
            out = pat.sub(lambda m: (m.group(1) if m.groups() else "") + "***", out)
        return out
    if isinstance(value, dict):
        return {k: mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    return value


def new_id(prefix: str) -> str:
    """Time-ordered, unique ids: 12 hex digits of milliseconds then 12 random hex digits."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def hash_api_key(key: str) -> str:
    # API keys are 256-bit random strings, so a fast hash is not brute-forceable; no salt needed.
    return hashlib.sha256(key.encode()).hexdigest()


def work_item_fence_key(work_item_id: str) -> str:
    return f"wi:{work_item_id}"


def workspace_lease_key(repo: str, branch: str) -> str:
    return f"ws:{repo}#{branch}"


class Store:
    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False, pre_ping: bool = True) -> None:
        """`pre_ping=False` (the worker pools) skips the round trip that tests each pooled connection before use; a
        fenced write whose first statement finds its connection dead is then run once more on a fresh connection
        (`_transaction`), and other calls fail into their activity's retry policy."""
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        kwargs: dict[str, Any] = {"echo": echo}
        if self.is_sqlite:
            kwargs["connect_args"] = {"timeout": 30}
        else:
            kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=pre_ping, pool_recycle=1800)
        self.engine: AsyncEngine = create_async_engine(url, **kwargs)
        if self.is_sqlite:
            self._configure_sqlite(self.engine)
        self._sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._upsert_stmt = self._upsert_increment()

    @staticmethod
    def _configure_sqlite(engine: AsyncEngine) -> None:
        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not the driver, open transactions, so that we can open them IMMEDIATE: a writer takes
            # the database write lock before it reads the fencing counter, making check-then-write atomic.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    async def close(self) -> None:
        await self.engine.dispose()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self._sessions() as s, s.begin():
            yield s

    async def _transaction(self, body: Callable[[AsyncSession, Callable[[], None]], Awaitable[T]]) -> T:
        """Run `body(session, started)` in a transaction. If the connection is found dead before `body` calls
        `started()` (after its first statement succeeded), nothing of it can have happened, and it runs once more on a
        fresh connection: a pooled connection that PostgreSQL closed (restart, pg_terminate_backend) costs a retry
        here instead of a round trip per checkout (pre-ping) or a failed activity attempt."""
        for attempt in (1, 2):
            begun = False

            def started() -> None:
                nonlocal begun
                begun = True

            try:
                async with self.session() as s:
                    return await body(s, started)
            except DBAPIError as exc:
                if attempt == 1 and not begun and exc.connection_invalidated:
                    continue
                raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ clock

    def _now_sql(self) -> Any:
        """The database clock as epoch seconds (float). Leases and timestamps never use a worker's clock."""
        if self.is_sqlite:
            return text("((julianday('now') - 2440587.5) * 86400.0)")
        return text("extract(epoch from clock_timestamp())::float8")

    async def _now(self, s: AsyncSession) -> float:
        return float((await s.execute(select(self._now_sql()))).scalar_one())

    async def db_now(self) -> float:
        async with self.session() as s:
            return await self._now(s)

    # ------------------------------------------------------------------ tenants and keys

    async def ensure_tenant(self, name: str) -> str:
        async with self.session() as s:
            existing = await s.scalar(select(Tenant.id).where(Tenant.name == name))
            if existing:
                return existing
            tid = new_id("tn")
            s.add(Tenant(id=tid, name=name, created_at=await self._now(s)))
            return tid

    async def create_api_key(self, tenant_name: str, scopes: Sequence[str] = ()) -> tuple[str, str]:
        """Returns (key id, plaintext key). The plaintext is shown once; only its hash is stored."""
        tenant_id = await self.ensure_tenant(tenant_name)
        plain = API_KEY_PREFIX + secrets.token_urlsafe(32)
        kid = new_id("key")
        async with self.session() as s:
            s.add(
                ApiKey(
                    id=kid,
                    tenant_id=tenant_id,
                    prefix=plain[:8],
                    key_hash=hash_api_key(plain),
                    scopes=",".join(sorted(set(scopes))),
                    created_at=await self._now(s),
                )
            )
        return kid, plain

    async def revoke_api_key(self, key_id: str) -> bool:
        async with self.session() as s:
            res = await s.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
                .values(revoked_at=await self._now(s))
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    async def list_api_keys(self, tenant_name: str | None = None) -> list[dict[str, Any]]:
        async with self.session() as s:
            q = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id).order_by(ApiKey.created_at)
            if tenant_name:
                q = q.where(Tenant.name == tenant_name)
            rows = (await s.execute(q)).all()
            return [
                {
                    "id": k.id,
                    "tenant": tname,
                    "prefix": k.prefix,
                    "scopes": k.scopes,
                    "created_at": k.created_at,
                    "revoked": k.revoked_at is not None,
                }
                for k, tname in rows
            ]

    async def authenticate(self, plain: str) -> Principal | None:
        digest = hash_api_key(plain)
        async with self.session() as s:
            key = await s.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
            if key is None or key.revoked_at is not None:
                return None
            if not hmac.compare_digest(key.key_hash, digest):
                return None
            return Principal(
                tenant_id=key.tenant_id,
                key_id=key.id,
                scopes=frozenset(x for x in key.scopes.split(",") if x),
            )

    # ------------------------------------------------------------------ work items

    async def create_work_item(
        self,
        *,
        tenant_id: str,
        spec: WorkItemSpec,
        base_commit: str | None,
        repo_path: str | None,
        workflow_id_prefix: str = "work-item-",
    ) -> tuple[WorkItem, bool]:
        """Insert a work item, or return the existing one for the same (tenant, idempotency key).

        Returns (row, created)."""
        if spec.idempotency_key:
            found = await self._by_idempotency(tenant_id, spec.idempotency_key)
            if found is not None:
                return found, False
        wid = new_id("wi")
        try:
            async with self.session() as s:
                now = await self._now(s)
                row = WorkItem(
                    id=wid,
                    tenant_id=tenant_id,
                    kind=spec.kind.value,
                    state=WorkItemState.submitted.value,
                    spec=spec.model_dump(mode="json"),
                    idempotency_key=spec.idempotency_key,
                    labels=dict(spec.labels),
                    repo_url=repo_path,
                    base_commit=base_commit,
                    workflow_id=f"{workflow_id_prefix}{wid}",
                    reason="",
                    attempt_count=0,
                    mock=False,
                    created_at=now,
                    updated_at=now,
                )
                s.add(row)
                s.add(
                    Event(
                        work_item_id=wid,
                        tenant_id=tenant_id,
                        type="submitted",
                        data=mask_secrets({"kind": spec.kind.value, "base_commit": base_commit}),
                        created_at=now,
                    )
                )
            return row, True
        except IntegrityError:
            if spec.idempotency_key:
                found = await self._by_idempotency(tenant_id, spec.idempotency_key)
                if found is not None:
                    return found, False
            raise

    async def _by_idempotency(self, tenant_id: str, key: str) -> WorkItem | None:
        async with self.session() as s:
            return await s.scalar(
                select(WorkItem).where(WorkItem.tenant_id == tenant_id, WorkItem.idempotency_key == key)
            )

    async def get_work_item(self, work_item_id: str, tenant_id: str | None = None) -> WorkItem | None:
        async with self.session() as s:
            q = select(WorkItem).where(WorkItem.id == work_item_id)
            if tenant_id is not None:
                q = q.where(WorkItem.tenant_id == tenant_id)
            return await s.scalar(q)

    async def list_work_items(
        self,
        tenant_id: str,
        *,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        state: str | None = None,
        kind: str | None = None,
    ) -> list[WorkItem]:
        """Newest first, keyset-paginated on (created_at, id)."""
        async with self.session() as s:
            q = select(WorkItem).where(WorkItem.tenant_id == tenant_id)
            if state:
                q = q.where(WorkItem.state == state)
            if kind:
                q = q.where(WorkItem.kind == kind)
            if before is not None:
                ts, bid = before
                q = q.where(or_(WorkItem.created_at < ts, and_(WorkItem.created_at == ts, WorkItem.id < bid)))
            q = q.order_by(WorkItem.created_at.desc(), WorkItem.id.desc()).limit(limit)
            return list((await s.scalars(q)).all())

    async def list_attempts(self, work_item_id: str) -> list[Attempt]:
        async with self.session() as s:
            q = select(Attempt).where(Attempt.work_item_id == work_item_id).order_by(Attempt.number)
            return list((await s.scalars(q)).all())

    async def list_events(self, work_item_id: str, after_id: int = 0, limit: int = 1000) -> list[Event]:
        async with self.session() as s:
            q = (
                select(Event)
                .where(Event.work_item_id == work_item_id, Event.id > after_id)
                .order_by(Event.id)
                .limit(limit)
            )
            return list((await s.scalars(q)).all())

    async def append_event(
        self,
        work_item_id: str,
        tenant_id: str,
        type_: str,
        data: dict[str, Any] | None = None,
        token: int | None = None,
    ) -> None:
        async with self.session() as s:
            s.add(
                Event(
                    work_item_id=work_item_id,
                    tenant_id=tenant_id,
                    type=type_,
                    data=mask_secrets(data or {}),
                    token=token,
                    created_at=await self._now(s),
                )
            )

    # ------------------------------------------------------------------ fencing

    def _upsert_increment(self) -> Any:
        ins = (postgresql.insert if not self.is_sqlite else sqlite.insert)(Fence).values(
            key=bindparam("fence_key"), token=1
        )
        return ins.on_conflict_do_update(index_elements=[Fence.key], set_={"token": Fence.token + 1}).returning(
            Fence.token
        )

    async def _issue(self, s: AsyncSession, key: str) -> int:
        # Hot path (every fenced write): a statement built once, run on the Core connection (no ORM layer).
        conn = await s.connection()
        return int((await conn.execute(self._upsert_stmt, {"fence_key": key})).scalar_one())

    async def insert_event(self, s: AsyncSession, **values: Any) -> None:
        """Append an event inside the caller's transaction `s` (an accepted fenced write's `apply`), with a Core
        INSERT: the ORM's unit of work cost ~0.3 ms of CPU per flush on this hot path."""
        conn = await s.connection()
        await conn.execute(_EVENT_INSERT, values)

    async def issue_token(self, key: str) -> int:
        """A new fencing token for `key`, strictly greater than every token issued for it before."""
        async with self.session() as s:
            return await self._issue(s, key)

    async def current_token(self, key: str) -> int | None:
        async with self.session() as s:
            return await s.scalar(select(Fence.token).where(Fence.key == key))

    async def fenced_write(
        self,
        *,
        token: int | None,
        work_item_id: str,
        tenant_id: str,
        writer: str,
        apply: Callable[[AsyncSession, float, int], Awaitable[T]],
        lease: tuple[str, float] | None = None,
        release_lease: bool = False,
    ) -> WriteResult[T]:
        """Run `apply(session, db_now, token)` only if `token` is still the newest issued for the work item's fence
        (`work_item_fence_key`).

        `token=None` issues a fresh token inside this write's own transaction (the writer is then the newest by
        construction, and issuing locks the fence row exactly as the check does): one transaction instead of two
        for a writer that takes a token just to write once (the control activities).

        `lease=(holder, ttl_s)` (with `token=None`) also takes the item's execution lease for `holder` under the new
        token, superseding any holder, in the same transaction: an activity attempt's start (take the execution
        lease, write its first state) in one transaction. `release_lease` releases the lease `token` holds together
        with an accepted write: an attempt's last write and its release in one transaction.

        A stale write changes nothing but an appended `stale_write_rejected` event naming both tokens."""
        if lease is not None and token is not None:
            raise ValueError("fenced_write: taking a lease needs a fresh token (token=None)")
        key = work_item_fence_key(work_item_id)

        async def body(s: AsyncSession, started: Callable[[], None]) -> WriteResult[T]:
            current: int | None
            if token is None:
                tok = current = await self._issue(s, key)
            else:
                tok = token
                current = await s.scalar(select(Fence.token).where(Fence.key == key).with_for_update())
            started()
            # The item's state and the database clock in one round trip, after the fence row is locked.
            conn = await s.connection()
            row = (
                await conn.execute(
                    select(WorkItem.state, self._now_sql()).where(WorkItem.id == bindparam("wid")),
                    {"wid": work_item_id},
                )
            ).first()
            if row is None:
                # No such work item: nothing to write to, and no event can name it.
                return WriteResult(ok=False, current_token=current, token=tok, missing=True)
            state, now = row[0], float(row[1])
            if lease is not None:
                await self._take_lease(s, key, lease[0], lease[1], tok, now)
            rejected = {"key": key, "presented_token": tok, "writer": writer}
            if current is None or tok < current:
                await self.insert_event(
                    s,
                    work_item_id=work_item_id,
                    tenant_id=tenant_id,
                    type="stale_write_rejected",
                    data={**rejected, "current_token": current},
                    token=tok,
                    created_at=now,
                )
                return WriteResult(ok=False, current_token=current, token=tok, state=state)
            # A terminal work item is closed. A zombie activity attempt that only *starts* after its item finished
            # (e.g. its process was SIGSTOPped before it took its lease) is issued a token newer than every write
            # so far; without this check its "running" write would reopen a finished item (found by the chaos soak).
            if WorkItemState(state).terminal:
                await self.insert_event(
                    s,
                    work_item_id=work_item_id,
                    tenant_id=tenant_id,
                    type="write_after_terminal_rejected",
                    data={**rejected, "state": state},
                    token=tok,
                    created_at=now,
                )
                return WriteResult(ok=False, current_token=current, closed=True, token=tok, state=state)
            value = await apply(s, now, tok)
            if release_lease:
                await self._release(s, key, tok, None, now)
            return WriteResult(ok=True, value=value, current_token=current, token=tok, state=state)

        return await self._transaction(body)

    async def set_state(
        self,
        *,
        work_item_id: str,
        tenant_id: str,
        token: int | None,
        state: WorkItemState,
        reason: str | None = None,
        writer: str,
        fields: dict[str, Any] | None = None,
        event_data: dict[str, Any] | None = None,
        lease: tuple[str, float] | None = None,
        record: AttemptRecord | None = None,
    ) -> WriteResult[None]:
        """A fenced state change. With `record`, the attempt's record is written in the same transaction under the
        same token (a `task` item's last attempt and its result: one write)."""

        async def _apply(s: AsyncSession, now: float, token: int) -> None:
            if record is not None:
                await self._record(s, now, token, work_item_id, tenant_id, record)
            await self._change_state(s, now, token, work_item_id, tenant_id, state, reason, fields, event_data)

        return await self.fenced_write(
            token=token,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            writer=writer,
            apply=_apply,
            lease=lease,
        )

    async def admit(self, *, work_item_id: str, tenant_id: str, writer: str) -> WriteResult[list[str | None]]:
        """Admission in one transaction: a fresh token, `submitted` -> `admitted` (only from `submitted`: a continued
        run re-admits an item that is already further on), and the item's failure fingerprints so far (`_fingerprints`).
        Rejected with `missing` when the item is not in the store, `closed` when it is already terminal."""

        async def _apply(s: AsyncSession, now: float, token: int) -> list[str | None]:
            await self._change_state(
                s,
                now,
                token,
                work_item_id,
                tenant_id,
                WorkItemState.admitted,
                "admitted",
                None,
                None,
                only_from="submitted",
            )
            return await self._fingerprints(s, work_item_id)

        return await self.fenced_write(
            token=None,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            writer=writer,
            apply=_apply,
        )

    async def _change_state(
        self,
        s: AsyncSession,
        now: float,
        token: int,
        work_item_id: str,
        tenant_id: str,
        state: WorkItemState,
        reason: str | None,
        fields: dict[str, Any] | None,
        event_data: dict[str, Any] | None,
        only_from: str | None = None,
    ) -> bool:
        """The state change of an accepted fenced write: the row, its `state_changed` event and the webhook outbox
        rows, in the caller's transaction. With `only_from`, nothing happens unless the item is in that state."""
        values: dict[str, Any] = {"state": state.value, "updated_at": now, "state_token": token}
        if reason is not None:
            values["reason"] = reason
        if fields:
            values.update(fields)
            if "result" in fields:
                values["result_token"] = token
        conn = await s.connection()
        q = update(WorkItem).where(WorkItem.id == work_item_id)
        if only_from is not None:
            q = q.where(WorkItem.state == only_from)
        res = await conn.execute(q.values(**values))
        if only_from is not None and not res.rowcount:  # type: ignore[attr-defined]
            return False
        await self.insert_event(
            s,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            type="state_changed",
            data=mask_secrets({"state": state.value, "reason": reason or "", **(event_data or {})}),
            token=token,
            created_at=now,
        )
        # Webhooks outbox (issue 7): notifications commit atomically with the change they announce.
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
                    "token": token,
                    "occurred_at": now,
                    **_delivery(fields),
                }
            ),
            now=now,
        )
        return True

    async def record_attempt(
        self, *, work_item_id: str, tenant_id: str, token: int | None, record: AttemptRecord, writer: str
    ) -> WriteResult[list[str | None]]:
        """Insert or replace attempt `record.number`'s record (a retried record activity overwrites its own attempt).

        The accepted write's value is the item's failure fingerprints in attempt order (None for a passed attempt),
        read in the same transaction: what the workflow's same-cause breaker needs."""

        async def _apply(s: AsyncSession, now: float, token: int) -> list[str | None]:
            await self._record(s, now, token, work_item_id, tenant_id, record)
            return await self._fingerprints(s, work_item_id)

        return await self.fenced_write(
            token=token,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            writer=writer,
            apply=_apply,
        )

    async def fingerprints(self, work_item_id: str) -> list[str | None]:
        async with self.session() as s:
            return await self._fingerprints(s, work_item_id)

    async def _fingerprints(self, s: AsyncSession, work_item_id: str) -> list[str | None]:
        """The item's failure fingerprints in attempt order, None for a passed attempt: what the workflow's
        same-cause breaker reads."""
        conn = await s.connection()
        rows = await conn.execute(
            select(Attempt.verdict, Attempt.fingerprint)
            .where(Attempt.work_item_id == work_item_id)
            .order_by(Attempt.number)
        )
        return [fp if verdict != "passed" else None for verdict, fp in rows.all()]

    async def _record(
        self, s: AsyncSession, now: float, token: int, work_item_id: str, tenant_id: str, r: AttemptRecord
    ) -> None:
        conn = await s.connection()
        row = {
            "token": token,
            "verdict": r.verdict,
            "reason": r.reason,
            "cause": r.cause,
            "fingerprint": r.fingerprint,
            "agent": mask_secrets(r.agent) if r.agent else None,
            "validation": mask_secrets(r.validation) if r.validation else None,
            "updated_at": now,
        }
        # Insert, or replace the same attempt's record (a retried record activity) in one statement.
        ins = (postgresql.insert if not self.is_sqlite else sqlite.insert)(Attempt).values(
            work_item_id=work_item_id, number=r.number, created_at=now, **row
        )
        await conn.execute(ins.on_conflict_do_update(index_elements=[Attempt.work_item_id, Attempt.number], set_=row))
        await conn.execute(
            update(WorkItem)
            .where(WorkItem.id == work_item_id)
            .values(
                attempt_count=func.max(WorkItem.attempt_count, r.number)
                if self.is_sqlite
                else func.greatest(WorkItem.attempt_count, r.number),
                updated_at=now,
            )
        )
        await self.insert_event(
            s,
            work_item_id=work_item_id,
            tenant_id=tenant_id,
            type="attempt_recorded",
            data={"number": r.number, "verdict": r.verdict, "reason": r.reason, "cause": r.cause},
            token=token,
            created_at=now,
        )

    # ------------------------------------------------------------------ leases

    async def acquire_lease(
        self, key: str, holder: str, ttl_s: float, *, supersede: bool = False
    ) -> tuple[int | None, str | None]:
        """Take the lease on `key` for `holder`. Returns (token, None) or (None, current holder).

        With `supersede`, the lease is taken even if held (a new activity attempt replaces the old one at once);
        otherwise only when free, expired, or already held by the same holder."""
        async with self.session() as s:
            now = await self._now(s)
            # Lock the counter row first so concurrent acquirers of the same key serialize here.
            token = await self._issue(s, key)
            row = await s.scalar(select(Lease).where(Lease.key == key).with_for_update())
            if row is not None and not supersede and row.holder != holder and row.expires_at > now:
                # Undo nothing: the issued token is simply never used; tokens need only be increasing, not dense.
                return None, row.holder
            await self._take_lease(s, key, holder, ttl_s, token, now, row)
            return token, None

    async def _take_lease(
        self, s: AsyncSession, key: str, holder: str, ttl_s: float, token: int, now: float, row: Lease | None = None
    ) -> None:
        """Make `holder` the lease's holder under `token` (the fence row of `key` is already locked by the caller's
        token issue), closing the previous holder's history row."""
        if row is None:
            row = await s.scalar(select(Lease).where(Lease.key == key).with_for_update())
        if row is not None:
            await s.execute(
                update(LeaseHistory)
                .where(
                    LeaseHistory.key == key,
                    LeaseHistory.token == row.token,
                    LeaseHistory.ended_at.is_(None),
                )
                .values(
                    ended_at=min(now, row.expires_at),
                    end_reason="superseded" if row.expires_at > now else "expired",
                )
            )
            row.holder, row.token, row.acquired_at, row.expires_at = holder, token, now, now + ttl_s
        else:
            s.add(Lease(key=key, holder=holder, token=token, acquired_at=now, expires_at=now + ttl_s))
        s.add(LeaseHistory(key=key, holder=holder, token=token, acquired_at=now))

    async def renew_lease(self, key: str, token: int, ttl_s: float) -> bool:
        """Extend the lease if `token` still holds it. False means it was lost: the holder must stop its work."""
        async with self.session() as s:
            now = await self._now(s)
            res = await s.execute(
                update(Lease)
                .where(Lease.key == key, Lease.token == token, Lease.expires_at > now)
                .values(expires_at=now + ttl_s)
            )
            return bool(res.rowcount)  # type: ignore[attr-defined]

    async def release_lease(self, key: str, token: int | None = None, holder: str | None = None) -> bool:
        async with self.session() as s:
            return await self._release(s, key, token, holder, await self._now(s))

    async def _release(self, s: AsyncSession, key: str, token: int | None, holder: str | None, now: float) -> bool:
        q = delete(Lease).where(Lease.key == key)
        if token is not None:
            q = q.where(Lease.token == token)
        if holder is not None:
            q = q.where(Lease.holder == holder)
        rows = (await s.execute(q.returning(Lease.token))).scalars().all()
        for t in rows:
            await s.execute(
                update(LeaseHistory)
                .where(LeaseHistory.key == key, LeaseHistory.token == t, LeaseHistory.ended_at.is_(None))
                .values(ended_at=now, end_reason="released")
            )
        return bool(rows)

    async def renew_leases_held_by(self, holder: str, key_prefix: str, ttl_s: float) -> int:
        """Extend (never shorten) every unexpired lease `holder` holds under `key_prefix`. Returns how many."""
        async with self.session() as s:
            now = await self._now(s)
            res = await s.execute(
                update(Lease)
                .where(
                    Lease.holder == holder,
                    Lease.key.startswith(key_prefix, autoescape=True),
                    Lease.expires_at > now,
                    Lease.expires_at < now + ttl_s,
                )
                .values(expires_at=now + ttl_s)
            )
            return int(res.rowcount)  # type: ignore[attr-defined]

    async def get_lease(self, key: str) -> Lease | None:
        async with self.session() as s:
            return await s.scalar(select(Lease).where(Lease.key == key))

    # ------------------------------------------------------------------ artifacts

    async def put_artifact(
        self,
        *,
        work_item_id: str,
        tenant_id: str,
        name: str,
        data: bytes,
        content_type: str = "text/plain",
        max_bytes: int = 16 * 1024 * 1024,
    ) -> Artifact:
        if len(data) > max_bytes:
            raise ArtifactTooLarge(f"artifact {name!r} is {len(data)} bytes; the limit is {max_bytes}")
        digest = hashlib.sha256(data).hexdigest()

        async def body(s: AsyncSession, started: Callable[[], None]) -> Artifact:
            now = await self._now(s)
            started()
            art = Artifact(
                id=new_id("art"),
                work_item_id=work_item_id,
                tenant_id=tenant_id,
                name=name,
                content_type=content_type,
                size=len(data),
                sha256=digest,
                content=data,
                created_at=now,
            )
            s.add(art)
            return art

        return await self._transaction(body)

    async def get_artifact(self, artifact_id: str, tenant_id: str | None = None) -> Artifact | None:
        async with self.session() as s:
            q = select(Artifact).where(Artifact.id == artifact_id)
            if tenant_id is not None:
                q = q.where(Artifact.tenant_id == tenant_id)
            return await s.scalar(q)

    async def artifact_content(self, artifact_id: str) -> bytes | None:
        """The bytes of an artifact (the content column is deferred everywhere else)."""
        async with self.session() as s:
            data = await s.scalar(select(Artifact.content).where(Artifact.id == artifact_id))
        return None if data is None else bytes(data)

    async def list_artifacts(self, work_item_id: str) -> list[Artifact]:
        async with self.session() as s:
            q = select(Artifact).where(Artifact.work_item_id == work_item_id).order_by(Artifact.created_at)
            return list((await s.scalars(q)).all())


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
