"""Live events as Server-Sent Events, fed from the append-only events table.

Each SSE event's `id` is the event row's id, so a client that reconnects with `Last-Event-ID` (or `?after=`) resumes
exactly after the last event it saw, across reconnects and API restarts, with nothing lost or repeated.

Exactness needs care on PostgreSQL: ids come from a sequence when a row is inserted, but transactions commit in
any order, so a reader that has seen id 12 may later see id 11 appear. A reader that simply remembered "after 12"
would lose 11. `EventHorizon` therefore tracks a *safe* id: the largest id such that every smaller id is either
visible or will never appear. It tails the (global) id sequence; at a gap it waits until every transaction that was
open in this database when the gap was seen has ended (then the missing id was rolled back and is gone for good).
Streams only ever emit rows with `id <= safe`. On SQLite, writers are serialized, so the newest id is always safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, StoreDep
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError
from crewwork.api.schemas import StreamEventView
from crewwork.observability import SSE_CLIENTS
from crewwork.store.store import Store
from crewwork.store.views import StoredEvent

log = logging.getLogger("crewwork.api.streams")

GAP_MIN_WAIT_S = 0.2
"""A gap is never skipped sooner (covers the instant between taking an id and the transaction getting an xid)."""
SSE_BATCH = 500
"""Events a stream reads per query."""
GAP_MAX_WAIT_S = 10.0
"""A gap is skipped after this long even if an old transaction is still open (bounded staleness)."""


class EventHorizon:
    def __init__(self, store: Store, poll_s: float = 0.2) -> None:
        self.store = store
        self.poll_s = poll_s
        self.safe = 0
        self.ready = asyncio.Event()
        self._advanced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._gap: tuple[int, float, set[tuple[int, str]]] | None = None
        self._subscribers = 0
        self._wanted = asyncio.Event()

    @contextlib.asynccontextmanager
    async def subscribed(self) -> AsyncIterator[None]:
        """Hold the horizon live for one stream. It tails the events table only while a stream is open: with none,
        it makes no query at all (an API process would otherwise poll the events table several times a second
        forever), and the first stream after an idle spell waits for a fresh safe id, found as at startup."""
        self._subscribers += 1
        self._wanted.set()
        try:
            await asyncio.wait_for(self.ready.wait(), 30)
            yield
        finally:
            self._subscribers -= 1

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_advance(self, within_s: float) -> bool:
        ev = self._advanced
        try:
            await asyncio.wait_for(ev.wait(), within_s)
            return True
        except TimeoutError:
            return False

    def _notify(self) -> None:
        ev, self._advanced = self._advanced, asyncio.Event()
        ev.set()

    async def _initial(self) -> int:
        top = await self.store.max_event_id()
        if self.store.is_sqlite:
            return top
        # Rows below `top` may still be in flight: wait for the transactions open now to end.
        before = await self.store.open_transaction_ids()
        deadline = time.monotonic() + GAP_MAX_WAIT_S
        while before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            before &= await self.store.open_transaction_ids()
        return top

    async def _step(self) -> bool:
        ids = await self.store.event_ids_after(self.safe, 2000)
        if not ids:
            return False
        if self.store.is_sqlite:
            self.safe = ids[-1]
            return True
        new_safe = self.safe
        for i in ids:
            if i == new_safe + 1:
                new_safe = i
                continue
            # A gap at new_safe + 1: skip it only once it cannot be filled any more.
            now = time.monotonic()
            if self._gap is None or self._gap[0] != new_safe + 1:
                self._gap = (new_safe + 1, now, await self.store.open_transaction_ids())
                break
            gap_id, seen, open_then = self._gap
            elapsed = now - seen
            if elapsed < GAP_MIN_WAIT_S:
                break
            still_open = open_then & await self.store.open_transaction_ids() if open_then else set()
            if still_open and elapsed < GAP_MAX_WAIT_S:
                self._gap = (gap_id, seen, still_open)
                break
            self._gap = None
            new_safe = i
        moved = new_safe != self.safe
        self.safe = new_safe
        return moved

    async def _run(self) -> None:
        while True:
            try:
                if not self._subscribers:
                    # Nothing reads the horizon: drop it and sleep until a stream subscribes. No await between
                    # the check and the wait, so a subscription cannot slip in unseen.
                    self.ready.clear()
                    self._wanted.clear()
                    self._gap = None
                    await self._wanted.wait()
                    continue
                if not self.ready.is_set():
                    self.safe = await self._initial()
                    self.ready.set()
                    self._notify()
                while await self._step():
                    self._notify()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # database briefly unavailable: keep the last safe id, retry
                log.warning("event horizon: %s", exc)
            await asyncio.sleep(self.poll_s)


def _sse(ev: StoredEvent) -> bytes:
    body = StreamEventView.of(ev).model_dump_json()
    return f"id: {ev.id}\nevent: {ev.type}\ndata: {body}\n\n".encode()


MAX_EVENT_ID = 2**62
"""The largest event id a client may resume after (as `?after=` allows): within the events table's bigint."""


def resume_point(last_event_id: str | None, after: int | None) -> int:
    """The id to resume after: the `Last-Event-ID` header wins over `?after=` (browsers send it on reconnect)."""
    if last_event_id:
        try:
            value = int(last_event_id.strip())
        except ValueError as exc:
            raise ProblemError(400, "invalid_last_event_id", "Last-Event-ID must be an event id (integer)") from exc
        if not 0 <= value <= MAX_EVENT_ID:
            # Above the events table's bigint, the stream's first read failed and the browser reconnected with the
            # same header every 2 s, for good.
            raise ProblemError(400, "invalid_last_event_id", f"Last-Event-ID must be between 0 and {MAX_EVENT_ID}")
        return value
    return after or 0


async def event_stream(
    request: Request,
    store: Store,
    horizon: EventHorizon,
    *,
    after: int | None,
    work_item_id: str | None = None,
    tenant_id: str | None = None,
    keepalive_s: float,
) -> AsyncIterator[bytes]:
    """Events after `after` (None: after the newest one safe now) as SSE, until the client goes away."""
    SSE_CLIENTS.inc()
    try:
        yield b"retry: 2000\n\n"
        async with horizon.subscribed():
            last = horizon.safe if after is None else after
            while True:
                rows = await store.events_between(
                    last, horizon.safe, limit=SSE_BATCH, work_item_id=work_item_id, tenant_id=tenant_id
                )
                for ev in rows:
                    yield _sse(ev)
                    last = ev.id
                if len(rows) == SSE_BATCH:
                    continue
                if await request.is_disconnected():
                    return
                if not await horizon.wait_advance(keepalive_s):
                    yield b": keepalive\n\n"
    finally:
        SSE_CLIENTS.dec()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

SSE_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A text/event-stream: one SSE event per row of the event log; `id` is the event id.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

router = APIRouter(prefix="/v1/events", tags=["events"], responses=PROBLEM_RESPONSES, route_class=CheckedJsonRoute)


@router.get(
    "/stream",
    summary="Live events of all the tenant's work items (Server-Sent Events, resumable with Last-Event-ID)",
    response_class=StreamingResponse,
    responses=SSE_RESPONSE,
)
async def tenant_stream(
    request: Request,
    principal: PrincipalDep,
    store: StoreDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
    after: Annotated[int | None, Query(ge=0, le=2**62, description="Resume after this event id.")] = None,
    all_tenants: Annotated[bool, Query(description="Admin only: every tenant's events.")] = False,
    tail: Annotated[bool, Query(description="Without a resume point, start after the newest event.")] = False,
) -> StreamingResponse:
    if all_tenants and not principal.admin:
        raise ProblemError(403, "forbidden", "all_tenants needs an API key with the `admin` scope")
    # `tail`: the stream starts after the newest safe event, read once it holds the horizon (event_stream).
    start = None if tail and not last_event_id and after is None else resume_point(last_event_id, after)
    opts = request.app.state.options
    return StreamingResponse(
        event_stream(
            request,
            store,
            request.app.state.horizon,
            after=start,
            tenant_id=None if all_tenants else principal.tenant_id,
            keepalive_s=opts.sse_keepalive_s,
        ),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )
