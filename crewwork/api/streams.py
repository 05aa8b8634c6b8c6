"""Live events as Server-Sent Events, fed from the append-only events table.

Each SSE event's `id` is the event row's id, so a client that reconnects with `Last-Event-ID` (or `?after=`) resumes
exactly after the last event it saw, across reconnects and API restarts, with nothing lost or repeated: a stream
only ever emits rows up to the safe id its `EventHorizon` (crewwork/api/horizon.py) holds.

When the API shuts down, every open stream ends at once with a resumable close (`EventHorizon.close`, called by
the server before it waits for open connections: `crewwork.cli.serve.ApiServer`): a `retry:` hint and a comment
naming the last event id sent, then the end of the stream. A client reconnects with `Last-Event-ID` (to this process
once it is back, or to another) and misses nothing; the process stops in well under a second instead of waiting on
its streams.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from crewwork.api.bodies import CheckedJsonRoute
from crewwork.api.deps import PrincipalDep, StateDep, StoreDep
from crewwork.api.horizon import EventHorizon
from crewwork.api.problems import PROBLEM_RESPONSES, ProblemError
from crewwork.api.schemas import StreamEventView
from crewwork.observability.metrics import SSE_CLIENTS
from crewwork.store.store import Store
from crewwork.store.views import StoredEvent

log = logging.getLogger("crewwork.api.streams")

SSE_BATCH = 500
"""Events a stream reads per query."""


def _sse(ev: StoredEvent) -> bytes:
    body = StreamEventView.of(ev).model_dump_json()
    return f"id: {ev.id}\nevent: {ev.type}\ndata: {body}\n\n".encode()


CLOSE_RETRY_MS = 1000
"""The reconnection delay a closing stream suggests (`retry:`): the API is restarting, or another one serves."""


CLOSE_COMMENT = ": close: the API is shutting down; reconnect with Last-Event-ID to resume after event"
"""The comment a stream ends with when the API shuts down (an SSE comment: every client ignores it, so none mistakes
it for an event; the console reads it to say the API is restarting)."""


def _close(last: int) -> bytes:
    """The stream's last message when the API shuts down: a reconnection hint and a comment naming the last event
    sent; then the stream ends, and a client reconnects with `Last-Event-ID: <last>` to resume."""
    return f"retry: {CLOSE_RETRY_MS}\n{CLOSE_COMMENT} {last}\n\n".encode()


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
    last = after or 0
    try:
        yield b"retry: 2000\n\n"
        async with horizon.subscribed():
            last = horizon.safe if after is None else after
            while not horizon.closing.is_set():
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
        yield _close(last)
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
    state: StateDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
    after: Annotated[int | None, Query(ge=0, le=2**62, description="Resume after this event id.")] = None,
    all_tenants: Annotated[bool, Query(description="Admin only: every tenant's events.")] = False,
    tail: Annotated[bool, Query(description="Without a resume point, start after the newest event.")] = False,
) -> StreamingResponse:
    if all_tenants and not principal.admin:
        raise ProblemError(403, "forbidden", "all_tenants needs an API key with the `admin` scope")
    # `tail`: the stream starts after the newest safe event, read once it holds the horizon (event_stream).
    start = None if tail and not last_event_id and after is None else resume_point(last_event_id, after)
    opts = state.options
    return StreamingResponse(
        event_stream(
            request,
            store,
            state.horizon,
            after=start,
            tenant_id=None if all_tenants else principal.tenant_id,
            keepalive_s=opts.sse_keepalive_s,
        ),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )
